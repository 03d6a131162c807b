"""Goodput and infrastructure events in an experiment tracker (pure core; backends are optional extras).

What goes to the tracker, whatever the tracker:

* the **goodput series**: one point per final interval of the run (:mod:`gpufleet.goodput.intervals`,
  the same intervals the report and the controller push use), at the interval's end time, with step =
  the training steps the reporting rank had run by then: ``goodput/ettr`` (ETTR so far), ``goodput/mfu``
  (MFU in the interval's steps, :attr:`Interval.mfu`), ``goodput/productive_s`` and
  ``goodput/badput_s/<category>`` (seconds in the interval), ``goodput/elapsed_s``;
* the **run's totals** from :func:`gpufleet.goodput.runreport.run_report` (``goodput_total/ettr``, MTTF,
  restarts, badput by category, MFU in steps / end to end / lost to restarts and stragglers);
* **infrastructure events** on the job's nodes (:class:`InfraEvent`): what the controller answers on
  ``GET /v1/jobs/{job}/events`` (XIDs, AER, ECC, drains, checkpoint requests, straggler findings, ...)
  and the run's own straggler findings.

A backend is a :class:`TrackerExporter`: :mod:`gpufleet.goodput.mlflow_export` (``pip install
gpufleet[mlflow]``) and :mod:`gpufleet.goodput.wandb_export` (``gpufleet[wandb]``). Each imports its
library when it is built and says which extra to install when it is missing (:func:`missing_extra`).
In the training loop :class:`gpufleet.goodput.tracker_loop.TrackerLoop` feeds one from a thread;
after the fact ``gpufleet goodput export RUN_DIR --mlflow URI | --wandb`` calls :func:`export_run`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from gpufleet.goodput.runlog import RankLog, RecordKind
from gpufleet.goodput.runreport import RunReport

EVENT_COLUMNS = ("time", "node", "source", "kind", "severity", "component", "code", "message", "attrs")


def missing_extra(library: str, extra: str, err: ImportError) -> ImportError:
    """The error a backend raises when its library is not installed: names the extra to install."""
    return ImportError(f"gpufleet's {library} export needs the {library} package, which is not installed "
                       f"({err}): pip install 'gpufleet[{extra}]'")


@dataclass(frozen=True, slots=True)
class InfraEvent:
    """Something that happened to a node the job ran on (one row of the tracker's events table)."""

    time: float  # Unix seconds
    node: str
    source: str  # event | transition | action (the controller's tables) | run (the run's own report)
    kind: str  # xid, aer_uncorrected, check_failed, draining, drain_after_checkpoint, straggler, ...
    message: str
    severity: str | None = None
    component: str | None = None
    code: int | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[float, str, str, str, str]:
        return self.time, self.node, self.source, self.kind, self.message

    def row(self) -> list[Any]:
        """The table row, in :data:`EVENT_COLUMNS` order (time as ISO 8601 UTC, attrs as JSON)."""
        when = datetime.fromtimestamp(self.time, UTC).isoformat(timespec="microseconds")  # fixed width: sorts
        return [when, self.node, self.source, self.kind, self.severity or "", self.component or "",
                "" if self.code is None else str(self.code), self.message,
                json.dumps(dict(self.attrs), sort_keys=True, default=str)]

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> InfraEvent:
        """One item of ``GET /v1/jobs/{job}/events``."""
        t = datetime.fromisoformat(str(doc["time"]).replace("Z", "+00:00"))
        return cls(time=t.timestamp(), node=str(doc["node"]), source=str(doc["source"]), kind=str(doc["kind"]),
                   message=str(doc.get("message") or ""), severity=doc.get("severity"),
                   component=doc.get("component"), code=doc.get("code"), attrs=dict(doc.get("attrs") or {}))


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    step: int  # training steps the reporting rank had run by ``time`` (a redone step counts again)
    time: float  # Unix seconds: the interval's end
    metrics: Mapping[str, float]


class TrackerExporter(Protocol):
    """A tracker backend. Calls come from one thread at a time; each may raise (the caller decides)."""

    def log_series(self, points: Sequence[SeriesPoint]) -> None: ...

    def log_totals(self, totals: Mapping[str, float], step: int) -> None: ...

    def log_events(self, events: Sequence[InfraEvent]) -> None:
        """``events``: every event so far, oldest first (a backend may replace what it logged before)."""

    def close(self) -> None: ...


def goodput_series(report: RunReport) -> list[SeriesPoint]:
    """One point per final interval of ``report`` (see the module docstring)."""
    iv = report.intervals
    if not iv:
        return []
    start = iv[0].start
    cats = sorted({k for i in iv for k, v in i.badput.as_dict().items() if v})
    productive, steps = 0.0, 0
    out: list[SeriesPoint] = []
    for i in iv:
        productive += i.productive
        steps += i.steps
        elapsed = i.end - start
        m: dict[str, float] = {"goodput/ettr": min(1.0, productive / elapsed) if elapsed > 0 else 0.0,
                               "goodput/elapsed_s": elapsed, "goodput/productive_s": i.productive}
        bad = i.badput.as_dict()
        m.update({f"goodput/badput_s/{k}": bad[k] for k in cats})
        if i.mfu is not None:
            m["goodput/mfu"] = i.mfu
        out.append(SeriesPoint(steps, i.end, m))
    return out


def goodput_totals(report: RunReport) -> dict[str, float]:
    """The run's totals as flat numbers (``goodput_total/...``), from the report itself."""
    g = report.goodput
    out = {"goodput_total/ettr": g.ettr, "goodput_total/elapsed_s": g.elapsed,
           "goodput_total/productive_s": g.productive, "goodput_total/restarts": float(len(report.restarts)),
           "goodput_total/steps_kept": float(report.steps_kept),
           "goodput_total/steps_redone": float(report.steps_redone),
           "goodput_total/checkpoints_durable": float(g.checkpoints),
           "goodput_total/stragglers": float(len(report.stragglers))}
    if g.mttf is not None:
        out["goodput_total/mttf_s"] = g.mttf
    out.update({f"goodput_total/badput_s/{k}": v for k, v in g.badput.as_dict().items()})
    if report.mfu is not None:
        out.update({"goodput_total/mfu_training": report.mfu.training,
                    "goodput_total/mfu_effective": report.mfu.effective,
                    "goodput_total/mfu_lost_to_restarts": report.mfu.lost_to_restarts,
                    "goodput_total/mfu_lost_to_stragglers": report.mfu.lost_to_stragglers})
    return out


def run_events(report: RunReport, logs: Sequence[RankLog]) -> list[InfraEvent]:
    """The run's own straggler findings as events, each at the time the slow rank finished the step it
    became slow at (from that rank's log)."""
    by_rank = {lg.rank: lg for lg in logs}
    out = []
    for s in report.stragglers:
        lg = by_rank.get(s.rank)
        times = [r.t for a in (lg.attempts if lg else ()) for r in a.records
                 if r.ev is RecordKind.STEP and r.step is not None and r.step >= s.from_step]
        at = min(times) if times else (report.intervals[-1].end if report.intervals else 0.0)
        out.append(InfraEvent(at, s.host, "run", "straggler", f"rank {s.rank} is {s.slowdown:.2f}x slower than its "
                              f"peers from step {s.from_step} ({s.steps} steps)", severity="degraded",
                              component=None if s.local_rank is None else f"gpu{s.local_rank}",
                              attrs={k: v for k, v in s.as_dict().items() if v is not None}))
    return out


def merge_events(*groups: Sequence[InfraEvent]) -> list[InfraEvent]:
    """All events once each (same time, node, source, kind and message), oldest first."""
    seen: dict[tuple[float, str, str, str, str], InfraEvent] = {}
    for g in groups:
        for e in g:
            seen.setdefault(e.key, e)
    return sorted(seen.values(), key=lambda e: e.key)


def export_run(report: RunReport, exporter: TrackerExporter, events: Sequence[InfraEvent] = ()) -> int:
    """Log a whole run: its series, totals and ``events``; the number of series points logged."""
    series = goodput_series(report)
    exporter.log_series(series)
    exporter.log_totals(goodput_totals(report), series[-1].step if series else 0)
    if events:
        exporter.log_events(events)
    return len(series)
