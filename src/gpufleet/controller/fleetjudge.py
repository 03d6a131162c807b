"""Fleet judging: check results that are robust low outliers in their SKU's fleet become evidence.

A hand-written floor (``checks/data/baselines.toml``) catches a GPU that is far too slow; it misses one
that is 15 % slower than its peers yet still above the floor. :class:`FleetJudge` reads the check
results the controller has stored (``check_passed`` / ``check_failed`` events with ``attrs.check``,
``value``, ``unit``, ``sku``, ``gpu``), keeps the latest value per (node, GPU, check) inside a window,
and runs :func:`gpufleet.checks.fleet.outliers` over them, per (SKU, check, unit). Every flagged node
that is ``ready`` or ``in_service`` gets ONE ``check_failed`` event, severity ``degraded``, source
``fleet``, posted through :meth:`Controller.ingest` — so it is just another producer of evidence and
the ordinary policy applies (suspect and drain at the next checkpoint, or drain when idle; the breaker
budget; dry-run).

The event id is derived from the flagged measurements (their own event ids), so judging the same
evidence again posts nothing new: the controller deduplicates by id.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpufleet.checks.events import result_slot
from gpufleet.checks.fleet import FleetSample, Outlier, outliers
from gpufleet.domain.errors import InvalidInput, NotFound
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.lifecycle.states import NodeState

from .service import Controller, IngestResult
from .store.repo import CheckEvent

log = logging.getLogger(__name__)

SOURCE = "fleet"  # the source of the events this module posts (and ignores when reading)
JUDGED_STATES = frozenset({NodeState.READY, NodeState.IN_SERVICE})
# Throughput and bandwidth checks, where only a too-low value is a problem (gemm_fp32 is the CPU path's).
DEFAULT_CHECKS = ("gemm_bf16", "gemm_fp16", "gemm_tf32", "gemm_fp8", "gemm_fp32", "hbm_copy")
DEFAULT_WINDOW = timedelta(hours=24)
DEFAULT_MIN_SAMPLES = 8
DEFAULT_THRESHOLD = 3.5
# At least 5 % below the median: with the library's 2 %, about 1 in 4000 healthy GPUs at a 1 % spread
# is flagged (measured, docs/checks.md), and a false flag costs a drain.
DEFAULT_MIN_REL = 0.05
DEFAULT_EVERY = 300  # reconciler passes between runs (5 min at the default 1 s interval); 0 = off


@dataclass(frozen=True, slots=True)
class Measured:
    """One stored check result as a fleet sample, with where it came from."""

    sample: FleetSample
    event_id: str
    time: datetime


@dataclass(frozen=True, slots=True)
class JudgeReport:
    """What one run saw and did."""

    samples: int  # latest (node, GPU, check) values judged
    unlabelled: int  # check events of a judged check without a usable sku/value/unit (left out)
    outliers: tuple[Outlier, ...]  # every flagged sample, most extreme first
    events: tuple[HealthEvent, ...]  # the events posted (one per flagged node in ready/in_service)
    accepted: int = 0  # new to the controller
    duplicates: int = 0  # already posted by an earlier run
    decisions: int = 0


class FleetJudge:
    """Turns fleet-relative outliers among stored check results into ``check_failed`` evidence.

    ``window``: how far back check results count (the latest per node/GPU/check is used).
    ``min_samples``: a (SKU, check) group with fewer latest values is not judged (too few to know what
    normal is), so a tiny fleet flags nothing. ``threshold`` / ``min_rel``: as in
    :func:`gpufleet.checks.fleet.outliers`. ``checks``: the check names judged (low side only).
    ``every``: :meth:`on_pass` runs the judge on the first pass and then every ``every`` passes.
    """

    def __init__(
        self,
        controller: Controller,
        window: timedelta = DEFAULT_WINDOW,
        min_samples: int = DEFAULT_MIN_SAMPLES,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        min_rel: float = DEFAULT_MIN_REL,
        checks: Sequence[str] = DEFAULT_CHECKS,
        every: int = DEFAULT_EVERY,
    ) -> None:
        if not isinstance(window, timedelta) or window <= timedelta(0):
            raise InvalidInput("window", window, "a positive duration, e.g. 24h")
        if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 3:
            raise InvalidInput("min_samples", min_samples, "an integer of at least 3")
        if not math.isfinite(threshold) or threshold <= 0:
            raise InvalidInput("threshold", threshold, "a positive robust z-score, e.g. 3.5")
        if not 0 <= min_rel < 1:
            raise InvalidInput("min_rel", min_rel, "a fraction in [0, 1)")
        if isinstance(checks, str) or not checks or not all(isinstance(c, str) and c for c in checks):
            raise InvalidInput("checks", checks, "a non-empty list of check names, e.g. ['gemm_bf16', 'hbm_copy']")
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise InvalidInput("every", every, "a number of reconciler passes >= 0 (0 = off)")
        self.controller = controller
        self.window = window
        self.min_samples = min_samples
        self.threshold = threshold
        self.min_rel = min_rel
        self.checks = frozenset(checks)
        self.every = every
        self._passes = 0
        self.last: JudgeReport | None = None

    # ---- cadence ----------------------------------------------------------------------------
    def on_pass(self) -> JudgeReport | None:
        """Called once per reconciler pass: runs on the first pass, then every ``every`` passes. A failed
        run is logged and tried again at the next due pass; it never fails the reconciler's pass."""
        if self.every == 0:
            return None
        self._passes += 1
        if (self._passes - 1) % self.every:
            return None
        try:
            return self.run_once(self.controller.clock.now())
        except Exception:
            log.exception("fleet judge run failed; trying again in %d passes", self.every)
            return None

    # ---- one run ----------------------------------------------------------------------------
    def run_once(self, now: datetime) -> JudgeReport:
        stored = self.controller.store.check_events_since(now - self.window, self.checks, exclude_source=SOURCE)
        latest, unlabelled = self.latest(stored)
        samples = [m.sample for m in latest.values()]
        found = outliers(samples, threshold=self.threshold, min_samples=self.min_samples,
                         min_rel=self.min_rel)
        sizes = Counter((s.sku, s.check, s.unit) for s in samples)
        per_node: dict[str, list[Outlier]] = {}
        for o in found:
            per_node.setdefault(o.sample.node, []).append(o)
        events = []
        for node, flagged in sorted(per_node.items()):
            try:
                state = self.controller.state_of(node)
            except NotFound:
                continue
            if state not in JUDGED_STATES:
                continue  # already held out (suspect, draining, drained, repair...): nothing to add
            sources = [latest[_key(o.sample)] for o in flagged]
            events.append(_event(node, flagged, sources, sizes, now, self.threshold))
        report = JudgeReport(len(samples), unlabelled, tuple(found), tuple(events))
        # The same evidence gives the same id (stamped with this run's time): an event already stored
        # is a duplicate, not re-posted (a reused id with another time would be a conflict).
        known = self.controller.store.known_event_ids([(e.node, e.id) for e in events]) if events else set()
        fresh = [e for e in events if (e.node, e.id) not in known]
        if events:
            res: IngestResult = self.controller.ingest(fresh) if fresh else IngestResult(0, 0, 0)
            report = JudgeReport(len(samples), unlabelled, tuple(found), tuple(events),
                                 res.accepted, res.duplicates + len(known), res.decisions)
            if res.accepted:
                log.warning("fleet judge: %d node(s) flagged as low outliers of their SKU's fleet (%s); "
                            "%d decision(s)", res.accepted, ", ".join(e.node for e in events), res.decisions)
        log.debug("fleet judge: %d samples, %d outlier(s), %d unlabelled result(s)",
                  len(samples), len(found), unlabelled)
        self.last = report
        return report

    def latest(self, stored: Iterable[CheckEvent]) -> tuple[dict[tuple[str, int | None, str], Measured], int]:
        """The latest judged-check measurement per (node, GPU, check), and how many were unusable."""
        latest: dict[tuple[str, int | None, str], Measured] = {}
        unlabelled = 0
        for e in stored:
            check = e.attrs.get("check", "")
            if check not in self.checks or e.attrs.get("scope") == "allocation":
                continue
            m = _measured(e, check)
            if m is None:
                unlabelled += 1
                continue
            key = _key(m.sample)
            prev = latest.get(key)
            if prev is None or (m.time, m.event_id) >= (prev.time, prev.event_id):
                latest[key] = m
        return latest, unlabelled


def _key(s: FleetSample) -> tuple[str, int | None, str]:
    return (s.node, s.gpu, s.check)


def _measured(e: CheckEvent, check: str) -> Measured | None:
    attrs = e.attrs
    sku, unit = attrs.get("sku", ""), attrs.get("unit", "")
    gpu_text = attrs.get("gpu", "")
    try:
        value = float(attrs.get("value", ""))
        gpu = int(gpu_text) if gpu_text else None
    except ValueError:
        return None
    if not sku or not unit or not math.isfinite(value) or (gpu is not None and gpu < 0):
        return None
    return Measured(FleetSample(e.node, gpu, sku, check, value, unit), e.id, e.time)


def _where(gpu: int | None) -> str:
    return "node" if gpu is None else f"gpu{gpu}"


def _event(node: str, flagged: Sequence[Outlier], sources: Sequence[Measured],
           sizes: Counter[tuple[str, str, str]], now: datetime, threshold: float) -> HealthEvent:
    """ONE degraded ``check_failed`` for ``node``, led by its most extreme outlier (``flagged[0]``)."""
    top, src = flagged[0], sources[0]
    s = top.sample
    n = sizes[(s.sku, s.check, s.unit)]
    message = (f"{s.check} {_where(s.gpu)}: {s.value:.4g} {s.unit} is a low outlier in the {s.sku} fleet "
               f"(median {top.median:.4g} {s.unit}, robust z {top.z:.2f} < -{threshold:g}, n={n})")
    others = [f"{o.sample.check} {_where(o.sample.gpu)} (z {o.z:.2f})" for o in flagged[1:]]
    if others:
        message += f"; also {', '.join(others)}"
    digest = hashlib.sha1("\n".join(sorted(m.event_id for m in sources)).encode()).hexdigest()[:16]
    attrs = {
        "rule": "fleet_outlier",  # judged by the catalog's rule entry (site-overridable), like any observation
        "check": s.check,
        "gpu": "" if s.gpu is None else str(s.gpu),
        "value": f"{s.value:.6g}",
        "unit": s.unit,
        "sku": s.sku,
        "fleet_median": f"{top.median:.6g}",
        "robust_z": f"{top.z:.3f}",
        "fleet_n": str(n),
        "threshold": f"{threshold:g}",
        "measured": src.time.isoformat(),
        "evidence": ",".join(m.event_id for m in sources),
        "outliers": str(len(flagged)),
    }
    return HealthEvent(
        id=f"fleet:{node}:{s.check}:{_where(s.gpu)}:{digest}",
        node=node,
        kind=EventKind.CHECK_FAILED,
        time=now,
        component=result_slot(node, s.gpu),
        message=message,
        source=SOURCE,
        attrs=tuple(sorted(attrs.items())),
    )
