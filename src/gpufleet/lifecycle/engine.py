"""The lifecycle engine: the in-memory heart of the controller (and of the simulator).

It holds every node's lifecycle state, the recent evidence per node, the breaker and the held
decisions; each entry point (``observe``, ``sync``, ``tick``, ``action_done``, ``operator``,
``reset_breaker``, ``set_dry_run``) returns a :class:`~gpufleet.lifecycle.plan.Plan` describing what
changed. The controller persists each plan in one transaction before acting on it; the simulator
just executes it. Pure: the caller passes the time in.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum

from gpufleet.domain.errors import Conflict, InvalidInput, NotFound
from gpufleet.domain.events import HealthEvent, Severity
from gpufleet.lifecycle.breaker import BreakerState, Budget
from gpufleet.lifecycle.decisions import (
    ActionKind,
    ComponentFault,
    Decision,
    DecisionStatus,
    PlannedAction,
    action_id,
    decision_id,
)
from gpufleet.lifecycle.plan import AuditEntry, OutboxAction, Plan
from gpufleet.lifecycle.policy import TIMED_STATES, NodeView, Policy, Sightings
from gpufleet.lifecycle.states import SCHEDULABLE, UNAVAILABLE, Actor, NodeState, transition
from gpufleet.lifecycle.validation import Situation, level_after

log = logging.getLogger(__name__)
S = NodeState
# Not part of the fleet the blast-radius budget is a share of: retired nodes, and nodes that have never
# served (new, in burn-in): a delivery of 500 spares must not let the breaker drain 50 more serving nodes.
_UNCOUNTED = frozenset({NodeState.RETIRED, NodeState.NEW, NodeState.BURN_IN})
_NONE = Decision("", "", datetime.min, NodeState.NEW, NodeState.NEW, "", "", Severity.INFO, actor_id="")


class OperatorOp(StrEnum):
    DRAIN = "drain"  # take the node out now (no budget check: a human decided)
    RESUME = "resume"  # suspect -> back in service; drained/repair -> revalidate
    REPAIR_DONE = "repair_done"  # repair -> revalidate
    RETIRE = "retire"
    BURN_IN = "burn_in"  # new -> burn_in


@dataclass(slots=True)
class NodeRecord:
    node: str
    state: NodeState
    since: datetime
    domains: frozenset[str] = frozenset()
    has_jobs: bool = False
    committed: bool = False  # a drain is queued or waiting for a checkpoint
    # Sightings of the events an escalation counts, not whole events: see policy.Sightings.
    recent: Sightings = field(default_factory=Sightings)

    def view(self) -> NodeView:
        return NodeView(self.node, self.state, self.since, self.has_jobs)


@dataclass(frozen=True, slots=True)
class SchedObservation:
    """What the scheduler says about one node (filled in by the controller from the scheduler port)."""

    has_jobs: bool
    drained_empty: bool  # drain flag set and no jobs left
    # Why the scheduler has the node out of service (drained or down, by anyone), "" if it can run jobs:
    # counted against the blast-radius budget while gpufleet has the node serving (an operator's drain,
    # the health-check hook's, a node down are unavailable all the same).
    out_in_scheduler: str = ""


@dataclass(slots=True)
class _Undo:
    """What the engine looked like before the calls since :meth:`LifecycleEngine.begin`."""

    held: dict[str, Decision]
    superseded: dict[str, Decision]
    external: set[str]
    breaker: BreakerState
    dry_run: bool
    records: dict[str, NodeRecord | None] = field(default_factory=dict)  # None: the node was added


class LifecycleEngine:
    def __init__(
        self,
        policy: Policy,
        nodes: Iterable[NodeRecord] = (),
        *,
        breaker: BreakerState | None = None,
        held: Iterable[Decision] = (),
        dry_run: bool | None = None,
        superseded: Iterable[Decision] = (),
    ) -> None:
        self.policy = policy
        self.budget = Budget(policy.config.max_unavailable_fleet, policy.config.max_unavailable_domain)
        self.nodes: dict[str, NodeRecord] = {n.node: n for n in nodes}
        self.breaker = breaker or BreakerState()
        self.held: dict[str, Decision] = {d.node: d for d in held}
        # node -> its own held decision that a correlated group's held decision took the place of
        self.superseded: dict[str, Decision] = {d.node: d for d in superseded if d.node in self.held}
        self.dry_run = policy.config.dry_run if dry_run is None else dry_run
        self._members: dict[str, frozenset[str]] | None = None
        # Kept up to date on every move so budget checks cost O(domains), not O(fleet).
        self._out: set[str] = set()
        # Serving in gpufleet's eyes, out in the scheduler's (SchedObservation.out_in_scheduler):
        # unavailable all the same, so the budget counts them.
        self.external: set[str] = set()
        self._uncounted: set[str] = set()
        self._timed: set[str] = set()  # nodes in a state with a time-driven rule (see Policy.on_tick)
        self._undo: _Undo | None = None
        for rec in self.nodes.values():
            self._refresh(rec)

    # ---- all or nothing ---------------------------------------------------------------------
    def begin(self) -> None:
        """Remember what the following calls change, until :meth:`commit` or :meth:`rollback`.

        The controller persists each plan after the engine made it; when that write fails, rollback
        puts the engine back exactly as it was, without reading the database (which may be down too).
        It costs one copy of each node record the calls touch, not a copy of the fleet."""
        self._undo = _Undo(dict(self.held), dict(self.superseded), set(self.external), self.breaker, self.dry_run)

    def commit(self) -> None:
        """The changes since :meth:`begin` are durable: forget how to undo them."""
        self._undo = None

    def rollback(self) -> None:
        """Undo every change since :meth:`begin` (nothing, if none was begun)."""
        u, self._undo = self._undo, None
        if u is None:
            return
        for node, saved in u.records.items():
            if saved is None:
                self.nodes.pop(node, None)
                self._members = None
                self._out.discard(node)
                self._uncounted.discard(node)
                self._timed.discard(node)
            else:
                self.nodes[node] = saved
                self._refresh(saved)
        self.held, self.superseded, self.breaker, self.dry_run = u.held, u.superseded, u.breaker, u.dry_run
        self.external = u.external

    def _touch(self, rec: NodeRecord) -> None:
        """Called before ``rec`` changes: keep a copy to roll back to (once per begin)."""
        u = self._undo
        if u is not None and rec.node not in u.records:
            u.records[rec.node] = replace(rec, recent=rec.recent.copy())

    # ---- inventory --------------------------------------------------------------------------
    def add_node(self, node: str, domains: frozenset[str], state: NodeState, now: datetime, actor_id: str) -> Plan:
        if node in self.nodes:
            raise Conflict(f"node {node} is already registered")
        if state not in (S.NEW, S.READY):
            raise InvalidInput("state", state, "new or ready (the states a node can be registered in)")
        if self._undo is not None:
            self._undo.records.setdefault(node, None)
        self.nodes[node] = NodeRecord(node, state, now, domains)
        self._members = None
        self._refresh(self.nodes[node])
        return Plan(audit=[AuditEntry(now, Actor.OPERATOR, actor_id, "register", node, f"registered as {state}")])

    def remember(self, events: Iterable[HealthEvent], now: datetime) -> None:
        """Load past evidence (after a restart, at ``now``) without deciding anything."""
        for e in sorted(events, key=lambda e: e.time):
            if e.node in self.nodes:
                self.policy.remember(self.nodes[e.node].recent, e, now)

    # ---- evidence ---------------------------------------------------------------------------
    def observe(self, events: Sequence[HealthEvent], now: datetime) -> Plan:
        plan = Plan()
        arrived: dict[str, list[HealthEvent]] = {}
        for e in sorted(events, key=lambda e: e.time):
            rec = self._node(e.node)
            self._touch(rec)
            self.policy.remember(rec.recent, e, now)
            arrived.setdefault(e.node, []).append(e)
        for node, mine in arrived.items():
            rec = self.nodes[node]
            self._prune(rec, now)
            view = rec.view()
            fresh = self.policy.fresh(view, mine, now)
            if len(fresh) < len(mine):
                plan.extend(self._stale(view, mine, fresh, now))
            decision = self.policy.decide(view, fresh, rec.recent, now)
            if decision is not None:
                plan.extend(self._apply(decision, now))
        return plan

    def _stale(self, view: NodeView, arrived: Sequence[HealthEvent], fresh: Sequence[HealthEvent],
               now: datetime) -> Plan:
        """Say so when faults arrive too late to act on (stamped before the node's last transition, or
        older than the lookback): a replayed old kernel log, an agent whose spool held them for long, a
        skewed clock. Nothing is decided on them, but nothing is dropped silently either: one audit line
        per node and batch, counted on the controller's metrics."""
        kept = {id(e) for e in fresh}
        late = [e for e in arrived if id(e) not in kept
                and self.policy.severity_of(e).severity.rank >= Severity.DEGRADED.rank]
        if not late:
            return Plan()
        first = late[0]
        code = "" if first.code is None else f" {first.code}"
        detail = (f"{len(late)} degraded/fatal event(s) not acted on: stamped before this node's last transition "
                  f"({view.state} since {view.since.isoformat(timespec='seconds')}, less the "
                  f"{self.policy.config.clock_skew} clock-skew allowance) or older than the "
                  f"{self.policy.lookback()} lookback; first: {first.id} ({first.kind.value}{code} stamped "
                  f"{first.time.isoformat(timespec='seconds')})")
        log.warning("%s: %s", view.node, detail)
        return Plan(audit=[AuditEntry(now, Actor.POLICY, "policy", "stale_evidence", view.node, detail)],
                    stale_events=len(late))

    def observe_component_fault(self, fault: ComponentFault, now: datetime) -> Plan:
        """Take every serving node behind a faulty shared component out as ONE decision.

        All of them fit the budget together, or none is taken: the whole group is held, the breaker
        trips naming the component, and an operator approves (``approve_held``) or cancels it.
        """
        targets = [n for n in fault.affected_nodes if n in self.nodes and self.nodes[n].state in SCHEDULABLE
                   and not self.nodes[n].committed and self.held.get(n, _NONE).actor_id != fault.group]
        if not targets:
            return Plan()
        plan = Plan()
        for n in targets:  # the group decision supersedes a node's own held decision, kept to hold again
            if n in self.held:  # if the group's is cancelled for the node (cancel_held)
                own = self.held.pop(n)
                if n in self.superseded:  # superseded before: a group's; the node's own is kept
                    plan.status_changes.append((own.id, DecisionStatus.CANCELLED))
                else:
                    self.superseded[n] = own
                    plan.status_changes.append((own.id, DecisionStatus.SUPERSEDED))
        reason = f"{fault.kind} {fault.component} faulty: {fault.reason}"
        decisions = []
        for n in targets:
            rec = self.nodes[n]
            if rec.has_jobs and fault.severity != Severity.FATAL:
                acts: tuple[PlannedAction, ...] = (PlannedAction(ActionKind.DRAIN_AFTER_CHECKPOINT, n, reason),)
                to = S.SUSPECT
            else:
                acts = (PlannedAction(ActionKind.DRAIN, n, reason),)
                if rec.has_jobs:
                    acts += (PlannedAction(ActionKind.REQUEUE_JOBS, n, reason),)
                to = S.DRAINING
            did = decision_id(n, "component_fault", rec.state, to, (fault.component, *fault.evidence))
            decisions.append(Decision(did, n, now, rec.state, to, "component_fault", reason, fault.severity,
                                      Actor.POLICY, fault.group, fault.evidence, acts))
        plan.audit.append(AuditEntry(now, Actor.POLICY, fault.group, "component_fault", fault.component,
                                     f"{reason}: {len(targets)} node(s) as one decision"))
        if self.dry_run:
            for d in decisions:
                plan.extend(self._apply(d, now))
            return plan
        why = self.breaker.reason if self.breaker.tripped else self._group_violation(targets)
        if why is not None:
            why = f"{fault.kind} {fault.component} would take {len(targets)} node(s) out: {why}"
            for d in decisions:
                plan.extend(self._hold(d, why, now))
            return plan
        for d in decisions:
            plan.extend(self._commit(d, now))
        return plan

    def approve_held(self, nodes: Iterable[str], actor_id: str, now: datetime) -> Plan:
        """An operator carries out held decisions despite the budget (e.g. a failed leaf switch)."""
        wanted = list(dict.fromkeys(nodes))
        missing = next((n for n in wanted if n not in self.held), None)
        if missing is not None:  # check all before changing anything: a refused request approves nothing
            raise NotFound("held decision for node", missing)
        plan = Plan()
        for n in wanted:
            d = self.held.pop(n)
            rec = self.nodes[n]
            plan.status_changes.append((d.id, DecisionStatus.CANCELLED))
            plan.audit.append(AuditEntry(now, Actor.OPERATOR, actor_id, "approve_held", n,
                                         f"approved {d.id} over the budget: {d.reason}"))
            if rec.state not in SCHEDULABLE:
                continue
            again = replace(d, id=decision_id(n, d.rule, rec.state, d.to_state, (*d.evidence, "approved")),
                            from_state=rec.state, time=now, actor=Actor.OPERATOR, actor_id=actor_id)
            plan.extend(self._commit(again, now))
        self._forget_superseded(plan, cancel=False)
        self._settle_breaker(plan, Actor.OPERATOR, actor_id, now)
        return plan

    def held_group(self, group: str) -> list[str]:
        """The nodes whose held decisions belong to ``group`` (e.g. ``correlate:leaf-su1-r3``)."""
        return sorted(n for n, d in self.held.items() if d.actor_id == group)

    def sync(self, observed: Mapping[str, SchedObservation], now: datetime) -> Plan:
        """Reconcile ready <-> in_service and draining -> drained with what the scheduler reports."""
        plan = Plan()
        for node, obs in observed.items():
            rec = self.nodes.get(node)
            if rec is None:
                continue
            if rec.has_jobs != obs.has_jobs:
                self._touch(rec)
            rec.has_jobs = obs.has_jobs
            if obs.out_in_scheduler and node not in self.external and rec.state in SCHEDULABLE:
                self.external.add(node)
                log.warning("%s: serving in gpufleet, out of service in the scheduler (%s): counted against the "
                            "blast-radius budget until it serves again", node, obs.out_in_scheduler)
            elif node in self.external and not (obs.out_in_scheduler and rec.state in SCHEDULABLE):
                self.external.discard(node)
                log.info("%s: serving in the scheduler again: no longer counted against the budget", node)
            if rec.state == S.READY and obs.has_jobs:
                plan.extend(self._move(rec, S.IN_SERVICE, now, "scheduler placed a job", Actor.SCHEDULER))
            elif rec.state == S.IN_SERVICE and not obs.has_jobs:
                plan.extend(self._move(rec, S.READY, now, "no job running", Actor.SCHEDULER))
            elif rec.state == S.DRAINING and obs.drained_empty:
                plan.extend(self._move(rec, S.DRAINED, now, "drain complete: node empty", Actor.SCHEDULER))
        return plan

    def tick(self, now: datetime, skip: Set[str] = frozenset()) -> Plan:
        """Time-driven rules; ``skip``: nodes a maintenance rollout holds (a node it drained is not
        handed to repair behind its back)."""
        plan = Plan()
        for node in sorted(self._timed - skip):  # only states with time-driven rules (drained, new)
            rec = self.nodes[node]
            decision = self.policy.on_tick(rec.view(), now)
            if decision is not None:
                plan.extend(self._apply(decision, now))
        return plan

    def action_done(self, action: PlannedAction, decision: str, now: datetime) -> Plan:
        """The reconciler carried ``action`` out: move a suspect node that was waiting to draining."""
        rec = self.nodes.get(action.node)
        if rec is None:
            return Plan()
        if action.kind in (ActionKind.DRAIN, ActionKind.DRAIN_AFTER_CHECKPOINT):
            self._touch(rec)
            rec.committed = False
            self._refresh(rec)
            if rec.state == S.SUSPECT:
                return self._move(rec, S.DRAINING, now, f"drained: {action.reason}", Actor.SYSTEM, decision=decision)
        return Plan()

    def repair_succeeded(self, node: str, step: str, level: str, key: str, now: datetime) -> Plan:
        """A repair step (``key``) carried out by an executor worked: repair -> revalidate, with a
        ``level`` validation. A no-op when the node is no longer in repair (a replay after a crash)."""
        rec = self._node(node)
        if rec.state != S.REPAIR:
            return Plan()
        why = f"{step} succeeded: revalidate before service"
        did = decision_id(node, "repair_done", rec.state, S.REVALIDATE, (key,))
        d = Decision(did, node, now, rec.state, S.REVALIDATE, "repair_done", why, Severity.INFO, Actor.SYSTEM,
                     f"executor:{step}", actions=(PlannedAction(ActionKind.VALIDATE, node, why, level=level),))
        return self._commit(d, now)

    # ---- maintenance (lifecycle.maintenance; controller.maintenance runs the rollouts) -------------
    def maintenance_drain(self, node: str, rollout: str, actor_id: str, now: datetime) -> Plan:
        """Take a serving node out for a maintenance rollout: its job is asked to checkpoint, then the
        node is drained (one ``drain_after_checkpoint`` action; it drains at once when no job runs).
        Conflict when the node is not serving or the breaker / budget forbids it: the rollout checked
        both before, this is the last word, under the same lock as every other decision."""
        rec = self._node(node)
        if rec.state not in SCHEDULABLE or rec.committed or node in self.held:
            what = "committed to a drain" if rec.committed else "held by the breaker" if node in self.held else ""
            raise Conflict(f"node {node} is {rec.state}{f' ({what})' if what else ''}: not serving, "
                           "not taken for maintenance")
        why = self.budget_violation(node, self._out)
        if why is not None:
            raise Conflict(f"node {node} not taken for maintenance: {why}")
        reason = f"maintenance {rollout}"
        did = decision_id(node, "maintenance", rec.state, S.DRAINING, (rollout,))
        d = Decision(did, node, now, rec.state, S.DRAINING, "maintenance", reason, Severity.INFO, Actor.OPERATOR,
                     actor_id, actions=(PlannedAction(ActionKind.DRAIN_AFTER_CHECKPOINT, node, reason),))
        return self._commit(d, now)

    def maintenance_work(self, node: str, what: str, actor_id: str, now: datetime) -> Plan:
        """A drained node's maintenance action is about to run: drained -> repair (out of service and
        being worked on; no repair action is queued: the rollout carries the action out). Success goes
        on with :meth:`repair_succeeded` (a validation), failure leaves the node in repair."""
        rec = self._node(node)
        if rec.state != S.DRAINED:
            raise Conflict(f"node {node} is {rec.state}, not drained: the maintenance action is not run")
        return self._move(rec, S.REPAIR, now, what, Actor.OPERATOR, actor_id=actor_id)

    def budget_violation(self, node: str, out: Set[str]) -> str | None:
        """Why the breaker forbids taking ``node`` out with ``out`` already out (tripped, or over the
        blast-radius budget), or None."""
        if self.breaker.tripped:
            return f"breaker tripped: {self.breaker.reason}"
        return self._violation(node, set(out) | self.external)

    # ---- operators --------------------------------------------------------------------------
    def operator(self, node: str, op: OperatorOp, actor_id: str, reason: str, now: datetime) -> Plan:
        rec = self._node(node)
        why = reason or f"operator {op}"
        st = rec.state
        acts: tuple[PlannedAction, ...] = ()
        if op == OperatorOp.DRAIN:
            if st not in (S.READY, S.IN_SERVICE, S.SUSPECT):
                raise Conflict(f"node {node} is {st}: only ready, in_service or suspect nodes can be drained")
            acts = (PlannedAction(ActionKind.DRAIN, node, why),)
            to = S.DRAINING
        elif op == OperatorOp.RESUME:
            if st == S.SUSPECT:
                to = S.IN_SERVICE if rec.has_jobs else S.READY
            elif st in (S.DRAINED, S.REPAIR):
                to = S.REVALIDATE
                acts = (PlannedAction(ActionKind.VALIDATE, node, "revalidate before service",
                                      level=level_after(Situation.PEOPLE)),)
            else:
                raise Conflict(f"node {node} is {st}: resume applies to suspect, drained or repair nodes "
                               "(a drained node is revalidated before it returns)")
        elif op == OperatorOp.REPAIR_DONE:
            if st != S.REPAIR:
                raise Conflict(f"node {node} is {st}, not in repair")
            to = S.REVALIDATE
            acts = (PlannedAction(ActionKind.VALIDATE, node, "revalidate after repair",
                                  level=level_after(Situation.PEOPLE)),)
        elif op == OperatorOp.RETIRE:
            to = S.RETIRED
            if st not in (S.DRAINING, S.DRAINED, S.REPAIR, S.RETIRED):
                acts = (PlannedAction(ActionKind.DRAIN, node, why),)
        elif op == OperatorOp.BURN_IN:
            if st != S.NEW:
                raise Conflict(f"node {node} is {st}: only new nodes start burn-in")
            to = S.BURN_IN
            acts = (PlannedAction(ActionKind.DRAIN, node, "burn-in before first use"),
                    PlannedAction(ActionKind.VALIDATE, node, "burn-in", level=level_after(Situation.BURN_IN)))
        else:  # pragma: no cover - exhaustive over OperatorOp
            raise InvalidInput("op", op, f"one of {[o.value for o in OperatorOp]}")
        did = decision_id(node, f"operator_{op}", st, to, (actor_id, now.isoformat()))
        d = Decision(did, node, now, st, to, f"operator_{op}", why, Severity.INFO, Actor.OPERATOR, actor_id,
                     actions=acts)
        plan = Plan()
        held = self.held.pop(node, None)
        if held is not None:
            plan.status_changes.append((held.id, DecisionStatus.CANCELLED))
        own = self.superseded.pop(node, None)
        if own is not None:  # a person decided about the node
            plan.status_changes.append((own.id, DecisionStatus.CANCELLED))
        plan.extend(self._commit(d, now))
        if held is not None:
            self._settle_breaker(plan, Actor.OPERATOR, actor_id, now)
        return plan

    def reset_breaker(self, actor_id: str, now: datetime, *, discard_held: bool) -> Plan:
        if self.dry_run and self.held and not discard_held:
            # Re-admitted in dry-run, a held decision would only be recorded as what it would do, and
            # be gone once dry-run is off: the node left suspect (schedulable) with nothing pending.
            raise Conflict(f"dry-run is on: a reset would re-admit {len(self.held)} held decision(s) that dry-run "
                           "cannot carry out, and lose them; turn dry-run off first, or discard them "
                           '({"discard_held": true})')
        plan = Plan(breaker=BreakerState(), audit=[AuditEntry(
            now, Actor.OPERATOR, actor_id, "breaker_reset", "breaker",
            f"reset; {len(self.held)} held decision(s) {'discarded' if discard_held else 're-admitted'}")])
        self.breaker = BreakerState()
        held = sorted(self.held.values(), key=lambda d: (-d.severity.rank, d.time))
        self.held.clear()
        for d in held:
            rec = self.nodes.get(d.node)
            if discard_held or rec is None or rec.state not in (S.READY, S.IN_SERVICE, S.SUSPECT):
                plan.status_changes.append((d.id, DecisionStatus.CANCELLED))
                if discard_held and rec is not None and rec.state == S.SUSPECT:
                    back = S.IN_SERVICE if rec.has_jobs else S.READY
                    plan.extend(self._move(rec, back, now, "held decision discarded by operator",
                                           Actor.OPERATOR, actor_id=actor_id, decision=d.id))
                continue
            plan.status_changes.append((d.id, DecisionStatus.CANCELLED))
            again = replace(d, id=decision_id(d.node, d.rule, rec.state, d.to_state, (*d.evidence, "readmit")),
                            from_state=rec.state, time=now)
            if self.dry_run or not (again.takes_node_out and again.from_state in SCHEDULABLE):
                plan.extend(self._apply(again, now))
                continue
            # Each on its own budget, most severe first: one that does not fit trips the breaker again,
            # but does not hold the others — a node in a domain with room is drained now.
            why = self._violation(again.node)
            plan.extend(self._commit(again, now) if why is None else self._hold(again, why, now))
        self._forget_superseded(plan, cancel=discard_held)
        return plan

    def cancel_held(self, node: str, actor_id: str, reason: str, now: datetime, *,
                    actor: Actor = Actor.OPERATOR) -> Plan:
        """Cancel the decision held for ``node`` (a false alarm; or, by the system, a decision only about an
        agent's silence once it is heard again); the node leaves suspect."""
        d = self.held.pop(node, None)
        if d is None:
            raise NotFound("held decision for node", node)
        own = self.superseded.pop(node, None)
        if own is not None:  # the group's hypothesis was wrong; the node's own fault still stands
            self.held[node] = own
            detail = (f"cancelled {d.id} ({d.reason}): {reason}; the node's own decision {own.id} ({own.reason}) "
                      "is held again")
            log.warning("%s: %s", node, detail)
            return Plan(status_changes=[(d.id, DecisionStatus.CANCELLED), (own.id, DecisionStatus.HELD)],
                        audit=[AuditEntry(now, actor, actor_id, "cancel_held", node, detail)])
        plan = Plan(status_changes=[(d.id, DecisionStatus.CANCELLED)], audit=[AuditEntry(
            now, actor, actor_id, "cancel_held", node, f"cancelled {d.id} ({d.reason}): {reason}")])
        rec = self.nodes[node]
        if rec.state == S.SUSPECT and not rec.committed:
            back = S.IN_SERVICE if rec.has_jobs else S.READY
            plan.extend(self._move(rec, back, now, f"held decision cancelled: {reason}", actor,
                                   actor_id=actor_id, decision=d.id))
        if actor == Actor.OPERATOR:  # the trip is a stop for people: the system's own cancel does not close it
            self._settle_breaker(plan, actor, actor_id, now)
        return plan

    def _forget_superseded(self, plan: Plan, *, cancel: bool) -> None:
        """Forget the superseded decisions of nodes no longer held (their group's decision was carried
        out, or a person acted on the node); ``cancel``: every one, recorded as cancelled."""
        for n in [n for n in self.superseded if cancel or n not in self.held]:
            d = self.superseded.pop(n)
            if cancel:
                plan.status_changes.append((d.id, DecisionStatus.CANCELLED))

    def _settle_breaker(self, plan: Plan, actor: Actor, actor_id: str, now: datetime) -> None:
        """After the held decisions were approved, cancelled or overtaken by an operator: the breaker says
        what holds now. With none held it closes, unless the fleet is over its budget even so (an approval
        over it): then it stays tripped, its reason saying so, until the nodes are back or a reset."""
        if not self.breaker.tripped or self.held:
            return
        out = self._out | self.external if self.external else self._out
        over = self.budget.excess(out, self._serving_members(), len(self.nodes) - len(self._uncounted))
        if over is None:
            detail = f"closed: no decision held and the fleet within its budget (tripped for: {self.breaker.reason})"
            self.breaker = BreakerState()
            log.info("blast-radius breaker %s", detail)
        else:
            detail = f"no decision held, but {over}: automation stays held until a reset (POST /v1/breaker/reset)"
            if self.breaker.reason == detail:
                return
            self.breaker = replace(self.breaker, reason=detail)
            log.warning("blast-radius breaker stays tripped: %s", detail)
        plan.breaker = self.breaker
        plan.audit.append(AuditEntry(now, actor, actor_id, "breaker_closed" if over is None else "breaker_open",
                                     "breaker", detail))

    def set_dry_run(self, on: bool, actor_id: str, now: datetime) -> Plan:
        self.dry_run = on
        return Plan(dry_run=on, audit=[AuditEntry(now, Actor.OPERATOR, actor_id, "dry_run", "mode",
                                                  "dry-run on: decide and record, act on nothing" if on
                                                  else "dry-run off: decisions are carried out")])

    def pairing_partners(self, node: str, count: int, idle: Set[str]) -> tuple[str, ...]:
        """``count`` known-good partners for validating ``node`` by pairing, or () if there are not
        enough now. A partner is ``ready`` in gpufleet (not in service: no job is taken from), idle in
        the scheduler (``idle``), not held or committed to a drain, and fits the blast-radius budget
        together with the nodes already out and the other partners (it is unavailable while the
        validation job holds it); none while the breaker is tripped. Nodes sharing a failure domain
        (a leaf switch) with ``node`` come first: the shortest path leaves only ``node``'s own links
        to blame."""
        rec = self._node(node)
        if self.breaker.tripped or count <= 0:
            return ()
        candidates = sorted(
            (n for n in idle if n != node and n in self.nodes and n not in self.held and n not in self._out
             and self.nodes[n].state == S.READY and not self.nodes[n].committed and not self.nodes[n].has_jobs),
            key=lambda n: (not (self.nodes[n].domains & rec.domains), n))
        out = set(self._out) | {node}
        chosen: list[str] = []
        for n in candidates:
            if len(chosen) == count:
                break
            if self._violation(n, out) is None:
                chosen.append(n)
                out.add(n)
        return tuple(chosen) if len(chosen) == count else ()

    # ---- internals --------------------------------------------------------------------------
    def unavailable(self) -> set[str]:
        return set(self._out)

    def _apply(self, d: Decision, now: datetime) -> Plan:
        """Policy decisions pass the dry-run switch and the breaker; operator ones go to _commit."""
        if self.dry_run:
            d = replace(d, status=DecisionStatus.DRY_RUN)
            return Plan(decisions=[d], audit=[AuditEntry(now, Actor.POLICY, "policy", "dry_run_decision", d.node,
                                                         f"would move {d.from_state} -> {d.to_state}: {d.reason}")])
        if d.takes_node_out and d.from_state in SCHEDULABLE:  # a node that was serving goes out
            why = self.breaker.reason if self.breaker.tripped else self._violation(d.node)
            if why is not None:
                return self._hold(d, why, now)
        return self._commit(d, now)

    def _hold(self, d: Decision, why: str, now: datetime) -> Plan:
        rec = self.nodes[d.node]
        old = self.held.get(d.node)
        if old is not None and old.severity.rank >= d.severity.rank:
            return Plan()  # already held for something at least as bad: nothing new to queue
        d = replace(d, status=DecisionStatus.HELD)
        plan = Plan(decisions=[d])
        if old is not None:
            plan.status_changes.append((old.id, DecisionStatus.CANCELLED))
        self.held[d.node] = d
        if not self.breaker.tripped:
            self.breaker = BreakerState(True, why, now)
            plan.breaker = self.breaker
            plan.audit.append(AuditEntry(now, Actor.POLICY, "breaker", "breaker_trip", "breaker", why))
            log.warning("blast-radius breaker tripped: %s; decisions are held until an operator resets it", why)
        plan.audit.append(AuditEntry(now, Actor.POLICY, "breaker", "held", d.node,
                                     f"held {d.from_state} -> {d.to_state} ({d.reason}): {why}"))
        if rec.state in (S.READY, S.IN_SERVICE):
            plan.extend(self._move(rec, S.SUSPECT, now, f"held by breaker: {d.reason}", Actor.POLICY, decision=d.id))
        return plan

    def _commit(self, d: Decision, now: datetime) -> Plan:
        rec = self._node(d.node)
        if rec.state != d.from_state:
            raise Conflict(f"node {d.node} is {rec.state}, decision {d.id} expected {d.from_state}")
        self._touch(rec)
        d = replace(d, status=DecisionStatus.APPLIED)
        plan = Plan(decisions=[d])
        plan.audit.append(AuditEntry(now, d.actor, d.actor_id, "decision", d.node,
                                     f"{d.rule}: {d.from_state} -> {d.to_state}: {d.reason}"))
        plan.extend(self._move(rec, d.to_state, now, d.reason, d.actor, actor_id=d.actor_id, decision=d.id,
                               evidence=d.evidence))
        for a in d.actions:
            plan.actions.append(OutboxAction(action_id(d.id, a.kind), d.id, a, now))
            if a.kind in (ActionKind.DRAIN, ActionKind.DRAIN_AFTER_CHECKPOINT):
                rec.committed = a.kind == ActionKind.DRAIN_AFTER_CHECKPOINT
                self._refresh(rec)
        return plan

    def _move(self, rec: NodeRecord, to: NodeState, now: datetime, reason: str, actor: Actor, *,
              actor_id: str = "", decision: str | None = None, evidence: tuple[str, ...] = ()) -> Plan:
        if rec.state == to:
            return Plan()
        self._touch(rec)
        t = transition(rec.node, rec.state, to, time=now, reason=reason, actor=actor,
                       actor_id=actor_id or actor.value, evidence=evidence, decision_id=decision)
        log.info("%s: %s -> %s (%s; %s)", rec.node, rec.state, to, reason, actor)
        rec.state, rec.since = to, now
        if to in UNAVAILABLE or to == S.RETIRED:
            rec.committed = False
        self._refresh(rec)
        return Plan(transitions=[t])

    def _refresh(self, rec: NodeRecord) -> None:
        if rec.state != S.RETIRED and (rec.state in UNAVAILABLE or rec.committed):
            self._out.add(rec.node)
        else:
            self._out.discard(rec.node)
        if rec.state in _UNCOUNTED:
            self._uncounted.add(rec.node)
        else:
            self._uncounted.discard(rec.node)
        if rec.state in TIMED_STATES:
            self._timed.add(rec.node)
        else:
            self._timed.discard(rec.node)

    def _serving_members(self, domains: Set[str] | None = None) -> dict[str, frozenset[str]]:
        """Each failure domain's nodes (of ``domains``, or all) that count towards the budget."""
        if self._members is None:
            members: dict[str, set[str]] = {}
            for r in self.nodes.values():
                for dom in r.domains:
                    members.setdefault(dom, set()).add(r.node)
            self._members = {k: frozenset(v) for k, v in members.items()}
        return {d: m - self._uncounted if self._uncounted else m for d, m in self._members.items()
                if domains is None or d in domains}

    def _violation(self, node: str, out: set[str] | None = None) -> str | None:
        rec = self.nodes[node]
        members_active = self._serving_members(rec.domains)
        if out is None:
            out = self._out | self.external if self.external else self._out
        return self.budget.violation(node, out, {node: rec.domains}, members_active,
                                     len(self.nodes) - len(self._uncounted))

    def _group_violation(self, nodes: Sequence[str]) -> str | None:
        out = self._out | self.external
        for n in nodes:
            why = self._violation(n, out)
            if why is not None:
                return why
            out.add(n)
        return None

    def _prune(self, rec: NodeRecord, now: datetime) -> None:
        self.policy.prune(rec.recent, now)

    def _node(self, node: str) -> NodeRecord:
        rec = self.nodes.get(node)
        if rec is None:
            raise NotFound("node", node)
        return rec
