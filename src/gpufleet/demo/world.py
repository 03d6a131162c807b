"""The demo's simulated world around a real controller: agents, technicians, an operator, a job.

Everything runs on one simulated clock, stepped deterministically, so a ``--seed`` reproduces a run.
The controller, its SQLite store, its policy, breaker and reconciler are the production code; only the
cluster (scheduler, GPUs, people) is simulated.
"""

from __future__ import annotations

import random
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.reconciler import Reconciler
from gpufleet.controller.service import Controller
from gpufleet.demo.job import TrainingJob
from gpufleet.demo.scenario import FaultKind, Injection, schedule
from gpufleet.domain.events import EventKind, HealthEvent, Severity
from gpufleet.domain.fleet import Fleet
from gpufleet.lifecycle.decisions import Decision, DecisionStatus
from gpufleet.lifecycle.engine import OperatorOp
from gpufleet.lifecycle.plan import Plan
from gpufleet.lifecycle.states import NodeState, Transition
from gpufleet.schedulers.sim import SimScheduler

START = datetime(2026, 11, 21, 0, 0, tzinfo=UTC)


class DemoScheduler(SimScheduler):
    """The sim scheduler, remembering when each node was drained (for detect-to-drain times)."""

    def __init__(self, nodes: list[str], clock: ManualClock) -> None:
        super().__init__(nodes)
        self.clock = clock
        self.drained_at: dict[str, datetime] = {}

    def drain(self, node: str, reason: str) -> None:
        before = self.node(node).state
        super().drain(node, reason)
        if self.node(node).state != before:
            self.drained_at.setdefault(node, self.clock.now())


@dataclass
class Validator:
    """Simulated active checks: a node passes unless the world says it is still broken."""

    world: World

    def request(self, node: str, level: str) -> None:
        delay = timedelta(minutes=30 if level == "burnin" else 15)
        self.world.later(self.world.clock.now() + delay, "validate", node)


@dataclass
class World:
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
            self.log.append(f"{_hm(now)} inject {inj.kind}: {inj.note} on {', '.join(inj.nodes[:3])}"
                            + (" ..." if len(inj.nodes) > 3 else ""))
        evs: list[HealthEvent] = []
        gpu = self._rng.randrange(8)
        for node in inj.nodes:
            comp = f"{node}-gpu{gpu}"
            if inj.kind == FaultKind.XID79:
                evs += [self._ev(node, EventKind.XID, comp, 79, "GPU has fallen off the bus"),
                        self._ev(node, EventKind.XID, comp, 45, "collateral channel teardown")]
                self.broken[node] = "GPU fell off the bus"
            elif inj.kind == FaultKind.XID48:
                evs += [self._ev(node, EventKind.XID, comp, 48, "DBE"),
                        self._ev(node, EventKind.ROW_REMAP_PENDING, comp, None, "row remap pending")]
                self.broken[node] = "uncorrectable ECC"
            elif inj.kind == FaultKind.XID95:
                evs.append(self._ev(node, EventKind.XID, comp, 95, "uncontained ECC"))
                self.broken[node] = "uncontained ECC"
            elif inj.kind == FaultKind.XID94:
                evs.append(self._ev(node, EventKind.XID, comp, 94, "contained ECC: row remap pending"))
            elif inj.kind == FaultKind.NVLINK:
                evs += [self._ev(node, EventKind.LINK_ERROR, f"{node}-nvlink{gpu}", None, "NVLink CRC errors",
                                 at=now - timedelta(seconds=9 * i)) for i in range(60)]
            elif inj.kind == FaultKind.LINK_FLAP:
                evs += [self._ev(node, EventKind.LINK_FLAP, f"{node}-nic{gpu}", None, "IB port flapped",
                                 at=now - timedelta(minutes=6 * i)) for i in range(5)]
                self.broken[node] = "IB link flapping"
            elif inj.kind == FaultKind.SWITCH:
                evs.append(self._ev(node, EventKind.LINK_DOWN, f"{node}-nic{gpu}", None, "IB port down"))
                self.broken[node] = "rack switch down"
            elif inj.kind == FaultKind.BAD_CHECK:
                evs.append(self._ev(node, EventKind.CHECK_FAILED, comp, None, "nccl-allreduce below threshold "
                                    "(buggy check rollout v2.3)", source="check"))
            elif inj.kind == FaultKind.NOISE:
                code = self._rng.choice((13, 31, 43))
                evs.append(self._ev(node, EventKind.XID, comp, code, "application fault"))
            if inj.kind not in (FaultKind.NOISE, FaultKind.BAD_CHECK):
                self.detect.setdefault(node, (now, inj.crashes_job))
        if inj.kind == FaultKind.SWITCH:
            self.later(now + timedelta(minutes=45), "switch_replaced", ",".join(inj.nodes))
        if inj.crashes_job and any(n in self.job.nodes() for n in inj.nodes):
            self.job.interrupt(now, inj.kind.value)
        return evs

    def _timer(self, what: str, node: str, now: datetime) -> list[HealthEvent]:
        if what == "repair_due":
            self._repairs.discard(node)
            if self.controller.state_of(node) == NodeState.REPAIR:
                if self.broken.get(node) != "rack switch down":
                    self.broken.pop(node, None)
                self.controller.operate(node, OperatorOp.REPAIR_DONE, "technician", "part replaced / reseated")
                self.log.append(f"{_hm(now)} technician finished repairing {node}")
            return []
        if what == "switch_replaced":
            for n in node.split(","):
                if self.broken.get(n) == "rack switch down":
                    del self.broken[n]
            self.log.append(f"{_hm(now)} technicians replaced the failed rack switch")
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
        """A careful on-call operator: reviews a tripped breaker within 30 minutes, cancels the held
        decisions that were false alarms (nodes that are healthy now), then resets the breaker so the
        real ones are re-admitted (still within the budget)."""
        b = self.controller.breaker
        if not b.tripped:
            self._breaker_seen = None
            return
        if self._breaker_seen is None:
            self._breaker_seen = now
            self.log.append(f"{_hm(now)} operator paged: breaker tripped ({b.reason})")
        if now - self._breaker_seen < timedelta(minutes=30):
            return
        held = list(self.controller.engine.held.values())
        false_alarms = [d for d in held if d.node not in self.broken]
        for d in false_alarms:
            self.controller.cancel_held(d.node, "operator:demo-oncall", "false alarm: node is healthy")
        self.controller.reset_breaker("operator:demo-oncall")
        self._breaker_seen = None
        self.log.append(f"{_hm(now)} operator cancelled {len(false_alarms)} false alarm(s), re-admitted "
                        f"{len(held) - len(false_alarms)} and reset the breaker")

    # ---- bookkeeping --------------------------------------------------------------------------
    def _ev(self, node: str, kind: EventKind, comp: str | None, code: int | None, msg: str, *,
            at: datetime | None = None, source: str = "agent", severity: Severity | None = None) -> HealthEvent:
        self._seq += 1
        return HealthEvent(f"demo-{self.seed}-{self._seq}", node, kind, at or self.clock.now(), comp, code,
                           severity=severity, message=msg, source=source)

    def _record(self, plan: Plan) -> None:
        self.decisions += [d for d in plan.decisions if d.status != DecisionStatus.CANCELLED]
        self.transitions += plan.transitions
        if plan.breaker is not None and plan.breaker.tripped:
            self.breaker_trips += 1

    def summary(self) -> dict[str, object]:
        drained = sorted({t.node for t in self.transitions if t.to_state == NodeState.DRAINING})
        returned = [t for t in self.transitions
                    if t.from_state == NodeState.REVALIDATE and t.to_state == NodeState.READY]
        repaired = [t for t in self.transitions if t.to_state == NodeState.REVALIDATE]
        d2d: dict[bool, list[float]] = {True: [], False: []}
        for n, (t0, fatal) in self.detect.items():
            if n in self.scheduler.drained_at and self.scheduler.drained_at[n] >= t0:
                d2d[fatal].append((self.scheduler.drained_at[n] - t0).total_seconds())
        status = Counter(d.status.value for d in self.decisions)
        report = self.job.report(self.clock.now())
        return {
            "seed": self.seed,
            "duration_hours": self.duration.total_seconds() / 3600,
            "nodes": len(self.fleet),
            "job_nodes": self.job.size,
            "interruptions": self.job.interruptions,
            "interruption_causes": dict(Counter(self.job.causes)),
            "drained": len(drained),
            "drained_nodes": drained,
            "repaired": len(repaired),
            "returned_to_service": len(returned),
            "detect_to_drain_s": {
                kind: {"count": len(v), "median": statistics.median(v) if v else None, "max": max(v) if v else None}
                for kind, v in (("fatal", d2d[True]), ("degraded_after_checkpoint", d2d[False]))},
            "breaker_trips": self.breaker_trips,
            "decisions": dict(status),
            "ettr": round(report.ettr, 4),
            "mttf_hours": round(report.mttf / 3600, 2) if report.mttf else None,
            "badput_hours": {k: round(v / 3600, 3) for k, v in asdict(report.badput).items() if v},
            "final_states": dict(Counter(self.controller.state_of(n.id).value for n in self.fleet)),
        }


def _hm(t: datetime) -> str:
    d = t - START
    return f"+{int(d.total_seconds() // 3600):02d}:{int(d.total_seconds() % 3600 // 60):02d}"


def build_world(controller: Controller, fleet: Fleet, clock: ManualClock, scheduler: DemoScheduler,
                duration: timedelta, seed: int, job_size: int) -> World:
    job = TrainingJob(scheduler, job_size, START)
    return World(fleet, controller, scheduler, clock, duration, seed, job, schedule(fleet, duration, seed))
