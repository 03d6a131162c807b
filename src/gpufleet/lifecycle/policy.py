"""The remediation policy: from (node state, recent events, clock) to at most one decision.

Pure: no I/O, no clock reads. Rules (catalog semantics; thresholds from the policy file):

* fatal evidence on a schedulable node -> drain now, requeue its jobs;
* degraded evidence on a ready/in-service node -> suspect; drain when the running job reaches its
  next checkpoint or ends (at once when it runs nothing);
* info -> recorded only; info events still count towards escalations ("N in window T");
* a node in revalidation or burn-in goes to ready on a passing check and to repair on a failing one;
* drained nodes go to repair (``auto_repair``), new nodes to burn-in (``auto_burn_in``); a node entering
  repair carries a ``repair`` action (the escalation ladder, lifecycle.repair).

Only newly arrived evidence, stamped no earlier than the node's last transition (minus a clock-skew
tolerance), can trigger a decision, so a repaired node is not drained again for the fault it was
repaired for; escalation counts look over the whole window.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpufleet.domain.catalog import Catalog, Escalation
from gpufleet.domain.events import WEAK_REPORT_RULES, EventKind, HealthEvent, Severity
from gpufleet.domain.judgement import judgement_of
from gpufleet.lifecycle.config import PolicyConfig
from gpufleet.lifecycle.decisions import ActionKind, Decision, PlannedAction, decision_id
from gpufleet.lifecycle.states import NodeState
from gpufleet.lifecycle.validation import Situation, level_after

S = NodeState
TIMED_STATES = frozenset({S.DRAINED, S.NEW})  # the states on_tick has rules for


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the policy may know about a node."""

    node: str
    state: NodeState
    since: datetime  # time of the last transition
    has_jobs: bool = False


# What an escalation counts of a past event: (time, kind, code). A plain tuple of atomic values on
# purpose: CPython stops tracking such tuples in its cycle collector, so a controller remembering
# hundreds of thousands of them pays nothing for them in garbage-collection pauses.
Sighting = tuple[datetime, str, int | None]


def sighting(e: HealthEvent, now: datetime | None = None) -> Sighting:
    """``e`` as an escalation counts it, at its time, or at ``now`` (when it arrived) if stamped later:
    an event cannot be counted as later than its arrival (an agent clock ahead that no heartbeat has
    measured yet)."""
    return (e.time if now is None or e.time <= now else now, str(e.kind.value), e.code)


def _at(s: Sighting) -> datetime:
    return s[0]


@dataclass(slots=True)
class Sightings:
    """What one node's escalations can still count: per escalation (by its index in the catalog), its
    newest ``count`` matching sightings, oldest first.

    Exact and bounded: every sighting is at most ``now`` (:func:`sighting` stamps one no later than its
    arrival), so "``count`` or more within the window ending now" holds exactly when the newest ``count``
    lie in that window and older ones are never needed; the memory per node is at most the sum of the
    escalations' counts (157 with the shipped ones) whatever the event rate. A single shared bound would
    let a storm of one kind (a day of corrected ECC errors) push out what another escalation still counts
    (the first of two XID 94s). Each escalation's sightings are a tuple of atomic tuples and the dict
    holds only those, so CPython stops tracking both: a node's history costs the cycle collector one
    object. Filled and pruned by :class:`Policy` (:meth:`Policy.remember`, :meth:`Policy.prune`)."""

    kept: dict[int, tuple[Sighting, ...]] = field(default_factory=dict)

    def copy(self) -> Sightings:
        return Sightings(dict(self.kept))  # the tuples are immutable: sharing them is a copy

    def __len__(self) -> int:
        """Distinct sightings held (one counted by two escalations is held once)."""
        return len({id(s) for v in self.kept.values() for s in v})

    def __iter__(self) -> Iterator[Sighting]:
        """Every distinct sighting held, oldest first."""
        seen: dict[int, Sighting] = {}
        for v in self.kept.values():
            for s in v:
                seen.setdefault(id(s), s)
        return iter(sorted(seen.values(), key=_at))


@dataclass(frozen=True, slots=True)
class Judged:
    event: HealthEvent
    severity: Severity
    why: str


class Policy:
    def __init__(self, config: PolicyConfig, catalog: Catalog) -> None:
        self.config = config
        self.catalog = catalog
        # Which events an escalation can count: only those need remembering.
        self._counted_kinds = frozenset(e.kind for e in catalog.escalations if e.code is None)
        self._counted_codes = frozenset((e.kind, e.code) for e in catalog.escalations if e.code is not None)

    def counted_kinds(self) -> frozenset[str]:
        """Every event kind some escalation counts (what a restart needs to reload)."""
        return self._counted_kinds | frozenset(k for k, _ in self._counted_codes)

    def remember(self, into: Sightings, e: HealthEvent, now: datetime) -> None:
        """Keep a sighting of ``e`` (arrived at ``now``) for every escalation that counts it, at most its
        count each."""
        s: Sighting | None = None
        kept = into.kept
        for i, esc in enumerate(self.catalog.escalations):
            if _matches(esc, e):
                s = s or sighting(e, now)
                v = kept.get(i, ())
                at = bisect_right(v, s[0], key=_at)
                v = (*v[:at], s, *v[at:])
                kept[i] = v[1:] if len(v) > esc.count else v

    def prune(self, kept: Sightings, now: datetime) -> None:
        """Drop the sightings no escalation can count any more (older than its window)."""
        for i, esc in enumerate(self.catalog.escalations):
            v = kept.kept.get(i)
            if v is None:
                continue
            since = now - esc.window
            old = next((n for n, s in enumerate(v) if s[0] >= since), len(v))
            if old == len(v):
                del kept.kept[i]
            elif old:
                kept.kept[i] = v[old:]

    # ---- judging events ---------------------------------------------------------------------
    def severity_of(self, event: HealthEvent) -> Judged:
        """The severity of one event on its own: its one judgement (domain.judgement), which the
        controller attached at ingest; collateral events count as info."""
        j = judgement_of(self.catalog, event)
        if j.collateral:
            return Judged(event, Severity.INFO, f"{_label(event)} is collateral of another error")
        name = f" ({j.name})" if j.name and (event.code is not None or event.attr("rule")) else ""
        basis = "" if j.basis == "catalog" else f" ({j.basis})"
        return Judged(event, j.severity, f"{_label(event)}{name}: {j.severity}{basis}")

    def escalate(self, fresh: Sequence[HealthEvent], history: Sightings, now: datetime) -> list[Judged]:
        """Escalations that fire because of at least one fresh event (``history`` includes the fresh ones)."""
        out: list[Judged] = []
        for i, esc in enumerate(self.catalog.escalations):
            trigger = next((e for e in reversed(fresh) if _matches(esc, e)), None)
            if trigger is None:
                continue
            since = now - esc.window
            n = sum(1 for t, _kind, _code in history.kept.get(i, ()) if since <= t <= now)
            if n >= esc.count:
                why = f"{_label(trigger)} seen {n} times within {esc.window} (threshold {esc.count})"
                out.append(Judged(trigger, esc.severity, why))
        return out

    # ---- deciding ---------------------------------------------------------------------------
    def evaluate(self, view: NodeView, events: Sequence[HealthEvent], now: datetime, *,
                 fresh_ids: frozenset[str] | None = None) -> Decision | None:
        """At most one decision for ``view`` given its recent ``events`` (any order, any age).

        ``fresh_ids`` names the events that just arrived (only those can trigger a decision); an event
        stamped earlier than the node's last transition minus ``clock_skew`` is stale even then (a
        late-delivered report of a fault that was already handled). Without ``fresh_ids``, every event
        stamped after the last transition (minus the skew) counts as fresh.
        """
        horizon = now - self.lookback()
        history = Sightings()
        for e in sorted(events, key=lambda e: e.time):
            if e.time >= horizon:
                self.remember(history, e, now)
        fresh = self.fresh(view, [e for e in events if fresh_ids is None or e.id in fresh_ids], now)
        return self.decide(view, fresh, history, now)

    def fresh(self, view: NodeView, arrived: Iterable[HealthEvent], now: datetime) -> list[HealthEvent]:
        """The events of ``arrived`` that may trigger a decision, oldest first: inside the lookback and
        stamped after the node's last transition (minus the clock-skew tolerance)."""
        horizon, cutoff = now - self.lookback(), view.since - self.config.clock_skew
        return sorted((e for e in arrived if e.time >= horizon and e.time > cutoff), key=lambda e: e.time)

    def decide(self, view: NodeView, fresh: Sequence[HealthEvent], history: Sightings,
               now: datetime) -> Decision | None:
        """The decision for ``view`` given the ``fresh`` events (from :meth:`fresh`) and the sightings
        of every remembered event in the window, fresh ones included."""
        judged = [self.severity_of(e) for e in fresh if e.kind not in (EventKind.CHECK_PASSED, EventKind.MOVED)]
        judged += self.escalate(fresh, history, now)
        worst = max(judged, key=lambda j: (j.severity.rank, j.event.time), default=None)
        st = view.state

        if st in (S.READY, S.IN_SERVICE, S.SUSPECT) and worst is not None:
            bad = [j for j in judged if j.severity == worst.severity]
            evidence = tuple(dict.fromkeys(j.event.id for j in bad))
            if worst.severity == Severity.FATAL:
                acts = [PlannedAction(ActionKind.DRAIN, view.node, worst.why)]
                if view.has_jobs:
                    acts.append(PlannedAction(ActionKind.REQUEUE_JOBS, view.node, worst.why))
                return self._decide(view, S.DRAINING, "fatal_event", worst, evidence, tuple(acts), now)
            if worst.severity == Severity.DEGRADED and st != S.SUSPECT:
                if view.has_jobs:
                    act = PlannedAction(ActionKind.DRAIN_AFTER_CHECKPOINT, view.node, worst.why)
                    return self._decide(view, S.SUSPECT, "degraded_event", worst, evidence, (act,), now)
                act = PlannedAction(ActionKind.DRAIN, view.node, worst.why)
                return self._decide(view, S.DRAINING, "degraded_idle", worst, evidence, (act,), now)
            return None

        if st in (S.REVALIDATE, S.BURN_IN):
            failed = [j for j in judged if j.severity in (Severity.FATAL, Severity.DEGRADED)]
            if failed:
                f = max(failed, key=lambda j: j.severity.rank)
                evidence = tuple(j.event.id for j in failed)
                # Drain again: a validation job may have run on the node undrained, inside a
                # maintenance reservation (a no-op where the node stayed drained).
                why = f"validation failed: {f.why}"
                back = (PlannedAction(ActionKind.DRAIN, view.node, why),
                        PlannedAction(ActionKind.REPAIR, view.node, why))
                return self._decide(view, S.REPAIR, "validation_failed", f, evidence, back, now)
            passed = [e for e in fresh if e.kind == EventKind.CHECK_PASSED]
            if passed:
                j = Judged(passed[-1], Severity.INFO, f"{st} passed: {_label(passed[-1])}")
                act = PlannedAction(ActionKind.RESUME, view.node, j.why)
                return self._decide(view, S.READY, "validation_passed", j, (passed[-1].id,), (act,), now)
        return None

    def on_tick(self, view: NodeView, now: datetime) -> Decision | None:
        """Time-driven moves that need no new evidence."""
        if view.state == S.DRAINED and self.config.auto_repair:
            act = PlannedAction(ActionKind.REPAIR, view.node, "drained: handed to repair")
            return self._decide_plain(view, S.REPAIR, "auto_repair", "drained: handed to repair", (act,), now)
        if view.state == S.NEW and self.config.auto_burn_in:
            acts = (
                PlannedAction(ActionKind.DRAIN, view.node, "burn-in before first use"),
                PlannedAction(ActionKind.VALIDATE, view.node, "burn-in", level=level_after(Situation.BURN_IN)),
            )
            return self._decide_plain(view, S.BURN_IN, "auto_burn_in", "new node: burn-in", acts, now)
        return None

    # ---- helpers ----------------------------------------------------------------------------
    def lookback(self) -> timedelta:
        """How far back evidence matters (the evidence window or the longest escalation window)."""
        longest = max((e.window for e in self.catalog.escalations), default=self.config.evidence_window)
        return max(longest, self.config.evidence_window)

    def _decide(
        self,
        view: NodeView,
        to: NodeState,
        rule: str,
        judged: Judged,
        evidence: tuple[str, ...],
        actions: tuple[PlannedAction, ...],
        now: datetime,
    ) -> Decision:
        did = decision_id(view.node, rule, view.state, to, evidence)
        return Decision(did, view.node, now, view.state, to, rule, judged.why, judged.severity,
                        evidence=evidence, actions=actions)

    def _decide_plain(
        self, view: NodeView, to: NodeState, rule: str, reason: str, actions: tuple[PlannedAction, ...], now: datetime
    ) -> Decision:
        did = decision_id(view.node, rule, view.state, to, (view.since.isoformat(),))
        return Decision(did, view.node, now, view.state, to, rule, reason, Severity.INFO, actions=actions)


def _matches(esc: Escalation, e: HealthEvent) -> bool:
    return (e.kind == esc.kind and (esc.code is None or e.code == esc.code)
            and (e.kind != EventKind.LINK_ERROR or e.attr("rule") not in WEAK_REPORT_RULES))


def _label(e: HealthEvent) -> str:
    where = f" on {e.component}" if e.component else ""
    code = f" {e.code}" if e.code is not None else ""
    return f"{e.kind}{code}{where}"

