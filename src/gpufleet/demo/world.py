"""The demo's simulated world around a real controller: agents, technicians, an operator, a job.

Everything runs on one simulated clock, stepped deterministically, so a ``--seed`` reproduces a run.
The controller, its SQLite store, its policy, breaker, correlator and reconciler are the production
code; only the cluster (scheduler, GPUs, fabric, people) is simulated. The fleet is the topology's
(``to_fleet``), and the agents name topology components and links in their events.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.reconciler import Reconciler
from gpufleet.controller.service import Controller
from gpufleet.demo.job import TrainingJob
from gpufleet.demo.report import START, Correlated, summarise
from gpufleet.demo.report import hm as _hm
from gpufleet.demo.scenario import FaultKind, Injection, Target, schedule
from gpufleet.domain.events import EventKind, HealthEvent, Severity
from gpufleet.domain.fleet import Fleet
from gpufleet.domain.topology import Topology
from gpufleet.lifecycle.decisions import Decision, DecisionStatus
from gpufleet.lifecycle.engine import OperatorOp
from gpufleet.lifecycle.plan import Plan
from gpufleet.lifecycle.states import NodeState, Transition
from gpufleet.schedulers.port import RunStatus
from gpufleet.schedulers.sim import SimScheduler

OPERATOR = "operator:demo-oncall"
# ComponentFault.group: the actor id of every decision the correlator's component fault made.
_GROUP_PREFIX = "correlate:"


class DemoScheduler(SimScheduler):
    """The sim scheduler, remembering when each node was drained (for detect-to-drain times)."""

    def __init__(self, nodes: list[str], clock: ManualClock) -> None:
        super().__init__(nodes)
        self.clock = clock
        self.drained_at: dict[str, datetime] = {}

    def drain(self, node: str, reason: str) -> bool:
        before = self.node(node).state
        drained = super().drain(node, reason)
        if self.node(node).state != before:
            self.drained_at.setdefault(node, self.clock.now())
        return drained


@dataclass
class Validator:
    """Simulated active checks: a node passes unless the world says it is still broken."""

    world: World
    partners: int = 0  # the simulated checks do not pair nodes

    def request(self, node: str, level: str, key: str, partners: Sequence[str] = ()) -> str:
        delay = timedelta(minutes=30 if level == "burnin" else 15)
        self.world.later(self.world.clock.now() + delay, "validate", node)
        return ""  # nothing to follow: the results arrive as check events

    def status(self, handle: str) -> RunStatus:
        return RunStatus()  # never asked: request hands out no handle (the results arrive on the world's timer)

    def cancel(self, handle: str) -> None:
        return None

    def release(self, node: str) -> None:
        return None

    def holds(self, node: str) -> bool:
        return False


@dataclass
class World:
    topology: Topology
    fleet: Fleet
    controller: Controller
    scheduler: DemoScheduler
    clock: ManualClock
    duration: timedelta
    seed: int
    job: TrainingJob
    injections: list[Injection]
    reconciler: Reconciler | None = None
    broken: dict[str, str] = field(default_factory=dict)  # node -> why (world truth)
    timers: list[tuple[datetime, str, str]] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    breaker_trips: int = 0
    correlated: dict[str, Correlated] = field(default_factory=dict)  # component -> its one decision
    switches_down: dict[str, tuple[str, ...]] = field(default_factory=dict)  # failed switch -> nodes (truth)
    review: timedelta = timedelta(minutes=10)  # the on-call operator acts this long after a page
    detect: dict[str, tuple[datetime, bool]] = field(default_factory=dict)  # node -> (injected at, fatal?)
    log: list[str] = field(default_factory=list)
    _seq: int = 0
    _rng: random.Random = field(default_factory=random.Random)
    _breaker_seen: datetime | None = None
    _repairs: set[str] = field(default_factory=set)  # nodes a technician is working on

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed * 7919 + 1)
        self.controller.on_plan.append(self._record)
        self.job.prefer = lambda n: (int(self.controller.state_of(n) == NodeState.SUSPECT), n)
        self.job.usable = lambda n: self.controller.state_of(n) not in (NodeState.NEW, NodeState.BURN_IN)

    # ---- time ---------------------------------------------------------------------------------
    def later(self, when: datetime, what: str, node: str) -> None:
        self.timers.append((when, what, node))

    def step(self, dt: timedelta) -> None:
        now = self.clock.advance(dt)
        events: list[HealthEvent] = []
        while self.injections and START + self.injections[0].at <= now:
            events += self._inject(self.injections.pop(0))
        due = [t for t in self.timers if t[0] <= now]
        self.timers = [t for t in self.timers if t[0] > now]
        for _when, what, node in sorted(due):
            events += self._timer(what, node, now)
        if int((now - START).total_seconds()) % 300 < dt.total_seconds():  # agents report every 5 min
            for n in self.fleet:
                if self.broken.get(n.id) != "GPU fell off the bus":
                    self.controller.heartbeat(n.id, now, "demo")
        if events:
            self.controller.ingest(events)
        self.job.step(now, dt)
        broken_in_job = [n for n in self.job.nodes() if n in self.broken]
        if broken_in_job and self.job.phase.value == "training":
            self.job.interrupt(now, f"crashed on {broken_in_job[0]} ({self.broken[broken_in_job[0]]})")
        if self.reconciler is not None:
            self.reconciler.run_once()
        self._operator(now)
        self._technicians(now)

    # ---- the world's actors -------------------------------------------------------------------
    def _inject(self, inj: Injection) -> list[HealthEvent]:
        now = self.clock.now()
        if inj.kind != FaultKind.NOISE:  # background noise is not news
            self.log.append(f"{_hm(now)} inject {inj.kind}: {inj.note} ({', '.join(inj.nodes[:3])}"
                            + (" ...)" if len(inj.nodes) > 3 else ")"))
        evs: list[HealthEvent] = []
        for t in inj.targets:
            evs += self._observe(inj.kind, t, now)
            # Detect-to-drain times are the controller's own; a switch's decision waits for a human.
            if inj.kind not in (FaultKind.NOISE, FaultKind.BAD_CHECK) and inj.culprit is None:
                self.detect.setdefault(t.node, (now, inj.crashes_job))
        if inj.culprit is not None:
            self.switches_down[inj.culprit] = inj.nodes
            self.later(now + timedelta(minutes=45), "switch_replaced", inj.culprit)
        if inj.crashes_job and any(n in self.job.nodes() for n in inj.nodes):
            self.job.interrupt(now, inj.kind.value)
        return evs

    def _observe(self, kind: FaultKind, t: Target, now: datetime) -> list[HealthEvent]:
        """What the node's agent reports, and what is now broken on it (world truth)."""
        node, comp = t.node, t.component
        if kind == FaultKind.XID79:
            self.broken[node] = "GPU fell off the bus"
            return [self._ev(node, EventKind.XID, comp, 79, "GPU has fallen off the bus"),
                    self._ev(node, EventKind.XID, comp, 45, "collateral channel teardown")]
        if kind == FaultKind.XID48:
            self.broken[node] = "uncorrectable ECC"
            return [self._ev(node, EventKind.XID, comp, 48, "DBE"),
                    self._ev(node, EventKind.ROW_REMAP_PENDING, comp, None, "row remap pending")]
        if kind == FaultKind.XID95:
            self.broken[node] = "uncontained ECC"
            return [self._ev(node, EventKind.XID, comp, 95, "uncontained ECC")]
        if kind == FaultKind.XID94:
            return [self._ev(node, EventKind.XID, comp, 94, "contained ECC: row remap pending")]
        if kind == FaultKind.NVLINK:
            return [self._ev(node, EventKind.LINK_ERROR, comp, None, "NVLink CRC errors", link=t.link,
                             at=now - timedelta(seconds=9 * i)) for i in range(60)]
        if kind == FaultKind.LINK_FLAP:
            self.broken[node] = "IB link flapping"
            return [self._ev(node, EventKind.LINK_FLAP, comp, None, "IB port flapped", link=t.link,
                             at=now - timedelta(minutes=6 * i)) for i in range(5)]
        if kind == FaultKind.SWITCH:
            self.broken[node] = "its leaf switch is down"
            return [self._ev(node, EventKind.LINK_DOWN, comp, None, "IB port down", link=t.link)]
        if kind == FaultKind.BAD_CHECK:
            return [self._ev(node, EventKind.CHECK_FAILED, comp, None, "nccl-allreduce below threshold "
                             "(buggy check rollout v2.3)", source="check")]
        code = self._rng.choice((13, 31, 43))
        return [self._ev(node, EventKind.XID, comp, code, "application fault")]

    def _timer(self, what: str, node: str, now: datetime) -> list[HealthEvent]:
        if what == "repair_due":
            self._repairs.discard(node)
            if self.controller.state_of(node) == NodeState.REPAIR:
                if not any(node in nodes for nodes in self.switches_down.values()):
                    self.broken.pop(node, None)
                self.controller.operate(node, OperatorOp.REPAIR_DONE, "technician", "part replaced / reseated")
                self.log.append(f"{_hm(now)} technician finished repairing {node}")
            return []
        if what == "switch_replaced":  # ``node`` is the switch: replacing it is the repair of its nodes
            nodes = self.switches_down.pop(node, ())
            for n in nodes:
                self.broken.pop(n, None)
                state = self.controller.state_of(n)
                if state in (NodeState.DRAINED, NodeState.REPAIR):
                    op = OperatorOp.REPAIR_DONE if state == NodeState.REPAIR else OperatorOp.RESUME
                    self.controller.operate(n, op, "technician", f"{node} replaced")
            self.log.append(f"{_hm(now)} technicians replaced {node}; its {len(nodes)} nodes go to revalidation")
            return []
        if what == "validate":
            if self.controller.state_of(node) not in (NodeState.REVALIDATE, NodeState.BURN_IN):
                return []
            if node in self.broken:
                return [self._ev(node, EventKind.CHECK_FAILED, None, None, f"validation failed: {self.broken[node]}",
                                 source="check", severity=Severity.DEGRADED)]
            return [self._ev(node, EventKind.CHECK_PASSED, None, None, "full validation passed", source="check")]
        return []

    def _technicians(self, now: datetime) -> None:
        """Each node that reaches repair gets a technician, who finishes 30-120 minutes later."""
        for n in self.fleet:
            if n.id not in self._repairs and self.controller.state_of(n.id) == NodeState.REPAIR:
                self._repairs.add(n.id)
                self.later(now + timedelta(minutes=self._rng.uniform(30, 120)), "repair_due", n.id)

    def _operator(self, now: datetime) -> None:
        """A careful on-call operator, paged when the breaker trips, acts within ``review``: approves a
        held correlated decision whose component really failed (one approval for all its nodes),
        cancels the held decisions that were false alarms (nodes that are healthy now), then resets
        the breaker so the remaining real ones are re-admitted (still within the budget)."""
        b = self.controller.breaker
        if not b.tripped:
            self._breaker_seen = None
            return
        if self._breaker_seen is None:
            self._breaker_seen = now
            self.log.append(f"{_hm(now)} operator paged: breaker tripped ({b.reason})")
        if now - self._breaker_seen < self.review:
            return
        held = list(self.controller.engine.held.values())
        groups: dict[str, list[str]] = {}
        for d in held:
            if d.actor_id.startswith(_GROUP_PREFIX):
                groups.setdefault(d.actor_id.removeprefix(_GROUP_PREFIX), []).append(d.node)
        for comp, nodes in groups.items():
            c = self.correlated.get(comp)
            if comp in self.switches_down:
                self.controller.approve_held(nodes, OPERATOR)
                outcome = f"approved by the operator at {_hm(now)} ({comp} is down; replaced 45 min after it failed)"
                self.log.append(f"{_hm(now)} operator approved the one held decision for {comp}: "
                                f"{len(nodes)} nodes drain until it is replaced")
            else:
                for n in nodes:
                    self.controller.cancel_held(n, OPERATOR, f"false alarm: {comp} is healthy")
                outcome = f"cancelled by the operator at {_hm(now)} (false alarm)"
            if c is not None:
                c.outcome = outcome
        false_alarms = [d for d in held if not d.actor_id.startswith(_GROUP_PREFIX) and d.node not in self.broken]
        for d in false_alarms:
            self.controller.cancel_held(d.node, OPERATOR, "false alarm: node is healthy")
        readmit = len(held) - len(false_alarms) - sum(len(v) for v in groups.values())
        self.controller.reset_breaker(OPERATOR)
        self._breaker_seen = None
        self.log.append(f"{_hm(now)} operator cancelled {len(false_alarms)} false alarm(s), re-admitted "
                        f"{readmit} and reset the breaker")

    # ---- bookkeeping --------------------------------------------------------------------------
    def _ev(self, node: str, kind: EventKind, comp: str | None, code: int | None, msg: str, *,
            at: datetime | None = None, source: str = "agent", severity: Severity | None = None,
            link: str | None = None) -> HealthEvent:
        self._seq += 1
        return HealthEvent(f"demo-{self.seed}-{self._seq}", node, kind, at or self.clock.now(), comp, code,
                           severity=severity, link=link, message=msg, source=source)

    def _record(self, plan: Plan) -> None:
        self.decisions += [d for d in plan.decisions if d.status != DecisionStatus.CANCELLED]
        for d in plan.decisions:
            if d.status != DecisionStatus.CANCELLED and d.actor_id.startswith(_GROUP_PREFIX):
                comp = d.actor_id.removeprefix(_GROUP_PREFIX)
                c = self.correlated.get(comp)
                if c is None:
                    c = self.correlated[comp] = Correlated(comp, self.topology.kind_of(comp), d.time, d.status,
                                                           frozenset(self.topology.nodes_behind(comp)))
                c.nodes.add(d.node)
        self.transitions += plan.transitions
        if plan.breaker is not None and plan.breaker.tripped:
            self.breaker_trips += 1

    def summary(self) -> dict[str, object]:
        return summarise(self)


def build_world(controller: Controller, topology: Topology, fleet: Fleet, clock: ManualClock,
                scheduler: DemoScheduler, duration: timedelta, seed: int, job_size: int) -> World:
    """``fleet`` is ``to_fleet(topology)``: the same node ids, racks, GPUs, NICs and leaves."""
    job = TrainingJob(scheduler, job_size, START)
    return World(topology, fleet, controller, scheduler, clock, duration, seed, job, schedule(topology, duration, seed))
