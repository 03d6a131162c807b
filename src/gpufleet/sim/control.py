"""The one seam through which node-level health decisions reach the simulator.

The simulator never decides on its own whether a node is drained, kept or returned: every fault,
early warning, executed checkpoint-drain and finished repair goes to a :class:`NodeControl`, once per
event (never per GPU per tick), and the simulator acts on the verdict. Two implementations:

* :class:`LifecycleControl` (default) — the production path: turns the event into the
  :class:`~gpufleet.domain.events.HealthEvent` an agent would send, feeds it to the production
  :class:`~gpufleet.lifecycle.engine.LifecycleEngine` (remediation policy, catalog, blast-radius
  breaker; policy file via ``lifecycle.config.load_policy``), and carries the plan's actions out
  through the scheduler port on the in-memory :class:`~gpufleet.schedulers.sim.SimScheduler`.
* :class:`FixedControl` — a fixed rule table (fault -> drain now; warning -> drain at a checkpoint
  when proactive drain is on; repaired -> return). Faster at 10^5 GPUs (the engine's budget check
  scans the fleet on every drain) and the reference the lifecycle path is tested against.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Protocol

from gpufleet.domain.catalog import Action
from gpufleet.domain.events import EventKind, HealthEvent, Severity
from gpufleet.domain.judgement import Judgement
from gpufleet.lifecycle.config import PolicyFile, load_policy
from gpufleet.lifecycle.decisions import ActionKind, DecisionStatus, PlannedAction
from gpufleet.lifecycle.engine import LifecycleEngine, OperatorOp, SchedObservation
from gpufleet.lifecycle.plan import Plan
from gpufleet.lifecycle.policy import Policy
from gpufleet.lifecycle.states import NodeState
from gpufleet.schedulers.port import drain_reason
from gpufleet.schedulers.sim import SimScheduler
from gpufleet.sim.failures import FailureCategory, Scope

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
_TICK = timedelta(milliseconds=1)


class Verdict(StrEnum):
    DRAIN_NOW = "drain_now"  # take the node out now (the job, if any, is interrupted)
    DRAIN_AT_CHECKPOINT = "drain_at_checkpoint"  # the job checkpoints, then restarts without the node
    KEEP = "keep"  # leave the node where it is
    HELD = "held"  # the controller wants it out, but the blast-radius breaker holds the decision


class NodeControl(Protocol):
    name: str
    calls: int

    def start(self, nodes: Sequence[tuple[str, frozenset[str]]], now: float) -> None:
        """The campaign begins with ``nodes`` (name, failure domains): job nodes and spares, all healthy."""
        ...

    def added(self, node: str, domains: frozenset[str], now: float) -> None:
        """A new replacement node joined the fleet (unlimited spares)."""
        ...

    def hold_until(self, now: float) -> float:
        """When held decisions will be released (an operator resets the breaker); ``now`` if none."""
        ...

    def fault(self, node: str, category: FailureCategory, now: float, in_job: bool) -> Verdict:
        """A fault struck ``node`` (``now``: seconds since the campaign began)."""
        ...

    def warning(self, node: str, category: FailureCategory, now: float, in_job: bool) -> Verdict:
        """``node`` shows early signs of a ``category`` fault."""
        ...

    def drained(self, node: str, now: float) -> None:
        """The job reached its checkpoint and left ``node`` (a drain-at-checkpoint is carried out)."""
        ...

    def repaired(self, node: str, now: float) -> None:
        """Repair of ``node`` finished (the technician reports done); validation follows."""
        ...

    def validated(self, node: str, now: float, passed: bool) -> bool:
        """The post-repair validation of ``node`` passed or failed; True to return it to service."""
        ...


class FixedControl:
    """Drain on faults, optionally drain on warnings at a checkpoint, return repaired nodes."""

    name = "fixed"

    def __init__(self, *, proactive_drain: bool = False) -> None:
        self.proactive_drain = proactive_drain
        self.calls = 0

    def start(self, nodes: Sequence[tuple[str, frozenset[str]]], now: float) -> None:
        return None

    def added(self, node: str, domains: frozenset[str], now: float) -> None:
        return None

    def hold_until(self, now: float) -> float:
        return now

    def fault(self, node: str, category: FailureCategory, now: float, in_job: bool) -> Verdict:
        self.calls += 1
        return Verdict.DRAIN_NOW if category.scope is Scope.NODE else Verdict.KEEP

    def warning(self, node: str, category: FailureCategory, now: float, in_job: bool) -> Verdict:
        self.calls += 1
        return Verdict.DRAIN_AT_CHECKPOINT if self.proactive_drain else Verdict.KEEP

    def drained(self, node: str, now: float) -> None:
        self.calls += 1

    def repaired(self, node: str, now: float) -> None:
        self.calls += 1

    def validated(self, node: str, now: float, passed: bool) -> bool:
        self.calls += 1
        return passed


class LifecycleControl:
    """The production lifecycle engine + policy, acting through the scheduler port.

    A fault becomes a fatal health event of the category's kind (the node stopped working under the
    job); a warning becomes a degraded one, judged by the policy's catalog. Repair completion is what
    a technician reports (``resume`` on a drained node -> revalidate), followed by a passing
    validation event -> ready, and the scheduler resumes the node.

    ``proactive_drain=False`` ignores warnings (no agent watching for early signs).

    When the breaker trips, the simulated on-call operator resets it ``operator_response`` seconds later
    (held decisions are re-admitted, as ``gpufleet`` operators do with ``breaker reset``); until then a
    held fault leaves a dead node that nobody sends to repair.
    """

    name = "lifecycle"

    def __init__(self, policy_file: PolicyFile | None = None, *, proactive_drain: bool = False,
                 operator_response: float = 4 * 3600.0) -> None:
        pf = policy_file if policy_file is not None else load_policy(None)
        self.engine = LifecycleEngine(Policy(pf.config, pf.catalog))
        self.scheduler = SimScheduler()
        self.proactive_drain = proactive_drain
        self.calls = 0
        self.held = 0  # decisions the blast-radius breaker held
        self.resets = 0  # breaker resets by the simulated operator
        self.failed_validations = 0  # revalidations that sent a node back to repair
        self.operator_response = operator_response
        self._seq = 0
        self._waiting: dict[str, tuple[str, ActionKind, str]] = {}  # node -> pending drain-after-checkpoint

    @staticmethod
    def when(now: float) -> datetime:
        return EPOCH + timedelta(seconds=now)

    def start(self, nodes: Sequence[tuple[str, frozenset[str]]], now: float) -> None:
        t = self.when(now)
        for n, domains in nodes:
            self._ensure(n, t, domains)

    def added(self, node: str, domains: frozenset[str], now: float) -> None:
        self._ensure(node, self.when(now), domains)

    def _ensure(self, node: str, t: datetime, domains: frozenset[str] = frozenset()) -> None:
        if node not in self.engine.nodes:
            self.engine.add_node(node, domains, NodeState.READY, t, "sim")
            self.scheduler.add_node(node)

    def hold_until(self, now: float) -> float:
        b = self.engine.breaker
        if not b.tripped or b.since is None:
            return now
        return max(now, (b.since - EPOCH).total_seconds() + self.operator_response)

    def _operator(self, now: float) -> None:
        """The on-call operator resets a breaker that has been tripped for ``operator_response``."""
        b = self.engine.breaker
        if b.tripped and self.hold_until(now) <= now:
            t = self.when(now)
            self.resets += 1
            plan = self.engine.reset_breaker("sim-oncall", t, discard_held=False)
            self._carry_out(plan, t)
            for tr in plan.transitions:
                if tr.to_state == NodeState.DRAINING:
                    self._settle(tr.node, t)

    def _event(self, node: str, category: FailureCategory, t: datetime, severity: Severity) -> HealthEvent:
        """The simulated signal of a failure: a crash (fatal) or a warning ahead of one (degraded). The
        failure model sets its severity — it is the simulation's ground truth, not a catalog reading —
        so it comes already judged, as the controller's ingest would hand it to the policy."""
        self._seq += 1
        judged = Judgement(severity, Action.DRAIN_AND_INSPECT, category.name, basis="simulated failure model")
        return HealthEvent(id=f"sim-{self._seq}", node=node, kind=category.event, time=t, code=category.code,
                           message=category.name, source="sim", judgement=judged)

    def _carry_out(self, plan: Plan, t: datetime) -> Verdict:
        verdict = Verdict.KEEP
        for d in plan.decisions:
            if d.status == DecisionStatus.HELD:
                self.held += 1
                verdict = Verdict.HELD
        for out in plan.actions:
            a = out.action
            if a.kind == ActionKind.DRAIN:
                self.scheduler.drain(a.node, drain_reason(out.decision_id, a.reason))
                verdict = Verdict.DRAIN_NOW
            elif a.kind == ActionKind.DRAIN_AFTER_CHECKPOINT:
                self._waiting[a.node] = (out.decision_id, a.kind, a.reason)
                if verdict in (Verdict.KEEP, Verdict.HELD):
                    verdict = Verdict.DRAIN_AT_CHECKPOINT
            elif a.kind == ActionKind.RESUME:
                self.scheduler.resume(a.node)
            # REQUEUE_JOBS: the simulator restarts its job itself; VALIDATE: the simulated
            # technician's check is reported by repaired() below.
        return verdict

    def _settle(self, node: str, t: datetime) -> None:
        """A drained node is empty at once in the simulator (the job was stopped or left it)."""
        rec = self.engine.nodes[node]
        if rec.state == NodeState.DRAINING:
            self.engine.sync({node: SchedObservation(has_jobs=False, drained_empty=True)}, t)

    def fault(self, node: str, category: FailureCategory, now: float, in_job: bool) -> Verdict:
        self.calls += 1
        if category.scope is Scope.JOB:
            return Verdict.KEEP
        self._operator(now)
        t = self.when(now)
        self._ensure(node, t)
        self.engine.sync({node: SchedObservation(has_jobs=in_job, drained_empty=False)}, t)
        # The evidence postdates the scheduler sync (the policy only acts on evidence newer than the
        # node's last transition).
        t = t + _TICK
        verdict = self._carry_out(self.engine.observe([self._event(node, category, t, Severity.FATAL)], t), t)
        if verdict is Verdict.DRAIN_NOW:
            self._waiting.pop(node, None)
            self._settle(node, t)
        return verdict

    def warning(self, node: str, category: FailureCategory, now: float, in_job: bool) -> Verdict:
        self.calls += 1
        if not self.proactive_drain:
            return Verdict.KEEP
        self._operator(now)
        t = self.when(now)
        self._ensure(node, t)
        self.engine.sync({node: SchedObservation(has_jobs=in_job, drained_empty=False)}, t)
        t = t + _TICK
        verdict = self._carry_out(self.engine.observe([self._event(node, category, t, Severity.DEGRADED)], t), t)
        if verdict is Verdict.DRAIN_NOW:
            self._settle(node, t)
        return verdict

    def drained(self, node: str, now: float) -> None:
        self.calls += 1
        pending = self._waiting.pop(node, None)
        if pending is None:
            return
        t = self.when(now)
        did, kind, reason = pending
        self.scheduler.drain(node, drain_reason(did, reason))
        self.engine.action_done(PlannedAction(kind, node, reason), did, t)
        self._settle(node, t)

    def repaired(self, node: str, now: float) -> None:
        self.calls += 1
        self._operator(now)
        t = self.when(now)
        rec = self.engine.nodes.get(node)
        if rec is None:
            return
        if rec.state == NodeState.DRAINING:
            self._settle(node, t)
        if rec.state == NodeState.SUSPECT:  # repaired while its drain was still held: clear it
            self.engine.operator(node, OperatorOp.RESUME, "sim-technician", "repair finished", t)
            self._waiting.pop(node, None)
        if rec.state in (NodeState.DRAINED, NodeState.REPAIR):
            self.engine.operator(node, OperatorOp.RESUME, "sim-technician", "repair finished", t)

    def validated(self, node: str, now: float, passed: bool) -> bool:
        self.calls += 1
        rec = self.engine.nodes.get(node)
        if rec is None:
            return passed
        if rec.state == NodeState.REVALIDATE:
            t = self.when(now) + _TICK
            self._seq += 1
            kind = EventKind.CHECK_PASSED if passed else EventKind.CHECK_FAILED
            result = HealthEvent(id=f"sim-{self._seq}", node=node, kind=kind, time=t, source="sim",
                                 message="revalidation " + ("passed" if passed else "failed"))
            self._carry_out(self.engine.observe([result], t), t)
            if not passed:
                self.failed_validations += 1
        return self.engine.nodes[node].state in (NodeState.READY, NodeState.IN_SERVICE)
