"""The discrete-event core: one replica of a training campaign on a simulated clock.

Only events move the clock: failure arrivals (one merged Poisson stream, thinned over the nodes),
early warnings, planned maintenance, repairs finishing, and the job's own next step (startup done,
checkpoint due, save done, ...). A 131,072-GPU, 90-day replica is a few tens of thousands of events;
nothing iterates over GPUs or ticks.

The job writes a :class:`~gpufleet.goodput.timeline.JobTimeline` as it goes; ETTR, MTTF and badput come
from :func:`gpufleet.goodput.ettr.compute` — the same accounting a real job's log gets.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass

from gpufleet.goodput.ettr import GoodputReport, compute
from gpufleet.goodput.timeline import JobTimeline, TimelineEvent, TimelineEventKind
from gpufleet.sim.config import SimConfig
from gpufleet.sim.control import LifecycleControl, NodeControl, Verdict
from gpufleet.sim.failures import Detection, FailureCategory, FailureMix, Scope
from gpufleet.sim.nodes import IN_JOB, REPAIR, SPARE, NodePool
from gpufleet.sim.trace import Effect, FaultTrace

K = TimelineEventKind

# Event types (heap entries are (time, seq, type, a, b, c)).
_DRAW, _FAIL, _WARN, _PLANNED, _JOB, _PERSIST, _REPAIRED, _TRACE, _VALIDATED = range(9)
# Job actions.
_A_START, _A_INIT, _A_RESTORED, _A_CKPT, _A_SAVED, _A_CHECK, _A_CHECKED, _A_DETECTED, _A_READY = range(9)
# Job phases.
_WAIT, _STARTING, _RESTORING, _TRAIN, _SAVE, _CHECK = range(6)
# Node status.
_IN_JOB, _SPARE, _REPAIR = IN_JOB, SPARE, REPAIR

PLANNED_CAUSE = "planned_maintenance"
DRAIN_CAUSE = "proactive_drain"


@dataclass(frozen=True, slots=True)
class ReplicaResult:
    seed: int
    report: GoodputReport
    events: int  # simulator events processed
    timeline_events: int
    control_calls: int
    node_waits: int  # restarts that had to wait for a repaired node
    peak_in_repair: int  # most nodes away for repair at once (spares needed never to wait)
    held_faults: int = 0  # faults whose drain the blast-radius breaker held
    escapes: int = 0  # repaired nodes that returned to service with their fault still there


class _Replica:
    def __init__(self, cfg: SimConfig, seed: int, control: NodeControl, trace: FaultTrace | None) -> None:
        self.cfg = cfg
        self.rng = random.Random(seed)
        self.control = control
        self.trace = trace
        self.heap: list[tuple[float, int, int, int, int, object]] = []
        self.seq = 0
        self.tl: list[TimelineEvent] = []
        self.horizon = cfg.horizon
        self.interval = cfg.interval()
        self.asynchronous = cfg.checkpoint_persist > 0
        # Nodes.
        j = cfg.nodes
        if trace is not None:
            j = min(j, trace.nodes - (cfg.hot_spares or 0))
        self.j = j
        self.unlimited = cfg.hot_spares is None
        self.pool = NodePool(j, cfg.hot_spares or 0, unlimited=self.unlimited, nodes_per_rack=cfg.nodes_per_rack)
        self.status = self.pool.status  # shared lists, read on the hot paths
        self.epoch = self.pool.epoch
        self.waiting_nodes = False
        self.node_waits = 0
        self.trace_repair: dict[int, float] = {}
        self.held_faults = 0
        self.escapes = 0
        self.last_fault: dict[int, FailureCategory] = {}
        # Job.
        self.phase = _WAIT
        self.gen = 0
        self.attempt = 0
        self.ckpt_id = 0
        self.have_ckpt = False
        self.since_ckpt = 0.0
        self.train_since = 0.0
        self.stop_saving = False
        self.pending: list[tuple[str, int, int]] = []  # (cause, node or -1, node epoch)
        self.events = 0
        self._failure_tables()

    # ---- plumbing -------------------------------------------------------------------------------
    def push(self, t: float, kind: int, a: int = 0, b: int = 0, c: object = None) -> None:
        if t <= self.horizon:
            self.seq += 1
            heapq.heappush(self.heap, (t, self.seq, kind, a, b, c))

    def emit(self, t: float, kind: TimelineEventKind, cause: str = "", ckpt: int | None = None) -> None:
        self.tl.append(TimelineEvent(t, kind, cause, ckpt))

    def job_at(self, t: float, action: int) -> None:
        self.gen += 1
        self.push(t, _JOB, self.gen, action)

    def name(self, node: int) -> str:
        return self.pool.name(node)

    # ---- failure streams ------------------------------------------------------------------------
    def _failure_tables(self) -> None:
        cfg = self.cfg
        self.exposed = self.pool.exposed()
        self.mix = FailureMix(cfg.categories, cfg.gpus_per_node, self.exposed, self.j,
                              skip_node_scope=self.trace is not None)
        self.total_rate = self.mix.rate
        self.lead = cfg.warning_lead if cfg.warning_fraction > 0 else 0.0

    def draw_next(self, after: float) -> None:
        if self.total_rate <= 0:
            return
        t_arr = after + self.rng.expovariate(self.total_rate)
        self.push(max(after, t_arr - self.lead), _DRAW, 0, 0, t_arr)

    def on_draw(self, now: float, t_arr: float) -> None:
        self.draw_next(t_arr)
        cat = self.mix.pick(self.rng.random())
        if cat.scope is Scope.JOB:
            self.push(t_arr, _FAIL, -1, 0, cat)
            return
        node = self.pool.at(int(self.rng.random() * self.exposed))
        if node < 0:
            return  # thinning: that position is not exposed right now
        if cat.warnable and self.cfg.warning_fraction > 0 and self.rng.random() < self.cfg.warning_fraction:
            self.push(now, _WARN, node, self.epoch[node], cat)
        self.push(t_arr, _FAIL, node, self.epoch[node], cat)

    # ---- nodes ----------------------------------------------------------------------------------
    def to_repair(self, t: float, node: int, duration: float | None = None) -> None:
        if not self.pool.remove(node):
            return
        until = self.trace_repair.pop(node, None)
        if until is not None:
            duration = max(0.0, until - t)
        d = self.cfg.repair.sample(self.rng) if duration is None else duration
        self.push(t + d, _REPAIRED, node, self.epoch[node])

    def fill(self, t: float) -> bool:
        """Put spares into empty job slots; True when the job has all its nodes."""
        complete, created = self.pool.fill()
        for node, slot in created:
            self.control.added(self.name(node), self.pool.domains(node, slot), t)
        return complete

    def on_repaired(self, t: float, node: int, epoch: int) -> None:
        if self.epoch[node] != epoch or self.status[node] != _REPAIR:
            return
        self.control.repaired(self.name(node), t)
        cfg = self.cfg
        escaped = cfg.repair_escape > 0 and self.rng.random() < cfg.repair_escape
        if cfg.revalidation > 0:
            self.push(t + cfg.revalidation, _VALIDATED, node, epoch, escaped)
        else:
            self.on_validated(t, node, epoch, escaped, checked=False)

    def on_validated(self, t: float, node: int, epoch: int, escaped: bool, *, checked: bool = True) -> None:
        """The post-repair validation ends (``checked=False``: there is none, the node just returns)."""
        if self.epoch[node] != epoch or self.status[node] != _REPAIR:
            return
        caught = checked and escaped and self.rng.random() < self.cfg.revalidation_catch
        if not self.control.validated(self.name(node), t, not caught):
            if caught:  # back to the bench
                self.push(t + self.cfg.repair.sample(self.rng), _REPAIRED, node, epoch)
            return  # refused without a finding: the node stays out (retired)
        self.pool.repair_over()
        self.pool.returned(node)
        if escaped and not caught:
            self.escapes += 1
            cat = self.last_fault.get(node, _ESCAPE)
            self.push(t + self.rng.expovariate(1.0 / self.cfg.escape_refail_mean), _FAIL, node, epoch, cat)
        if self.waiting_nodes and self.fill(t):
            self.waiting_nodes = False
            self.job_at(t + self.cfg.requeue, _A_START)

    # ---- the job --------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.phase != _WAIT

    def leave_train(self, t: float) -> None:
        if self.phase == _TRAIN:
            self.since_ckpt += t - self.train_since

    def enter_train(self, t: float) -> None:
        self.phase = _TRAIN
        self.train_since = t
        if self.live_pending():
            self.begin_stop_save(t)
            return
        due = t + max(0.0, self.interval - self.since_ckpt)
        every = self.cfg.health_check_every
        if self.cfg.health_check_cost > 0 and every > 0:
            tick = (math.floor(t / every) + 1) * every
            if tick < due:
                self.job_at(tick, _A_CHECK)
                return
        self.job_at(due, _A_CKPT)

    def live_pending(self) -> bool:
        self.pending = [p for p in self.pending
                        if p[1] < 0 or (self.status[p[1]] == _IN_JOB and self.epoch[p[1]] == p[2])]
        return bool(self.pending)

    def begin_stop_save(self, t: float) -> None:
        """A final, durable checkpoint before a planned stop (blocking for write + persist)."""
        self.leave_train(t)
        self.phase = _SAVE
        self.stop_saving = True
        self.emit(t, K.CHECKPOINT_SAVE_START)
        self.job_at(t + self.cfg.checkpoint_write + self.cfg.checkpoint_persist, _A_SAVED)

    def planned_stop(self, t: float) -> None:
        causes = [p[0] for p in self.pending]
        cause = PLANNED_CAUSE if PLANNED_CAUSE in causes else causes[0]
        for _, node, ep in self.pending:
            if node >= 0 and self.status[node] == _IN_JOB and self.epoch[node] == ep:
                self.control.drained(self.name(node), t)
                self.to_repair(t, node)
        self.pending.clear()
        self.interrupt_common(t)
        self.emit(t, K.MAINTENANCE, cause)
        downtime = self.cfg.maintenance_downtime if cause == PLANNED_CAUSE else 0.0
        self.job_at(t + downtime, _A_READY)

    def interrupt_common(self, t: float) -> None:
        self.leave_train(t)
        self.phase = _WAIT
        self.attempt += 1
        self.stop_saving = False
        self.since_ckpt = 0.0

    def fail(self, t: float, cat: FailureCategory, cause: str | None = None) -> None:
        """An unexpected interruption of the running job."""
        self.interrupt_common(t)
        self.emit(t, K.FAILURE, cause or cat.name)
        # Pending planned work is absorbed by the outage: maintenance happens now, warned nodes go.
        for _, node, ep in self.pending:
            if node >= 0 and self.status[node] == _IN_JOB and self.epoch[node] == ep:
                self.control.drained(self.name(node), t)
                self.to_repair(t, node)
        self.pending.clear()
        self.job_at(self.detect_time(t, cat.detection), _A_DETECTED)

    def detect_time(self, t: float, how: Detection) -> float:
        if how is Detection.IMMEDIATE:
            return t
        limit = self.cfg.watchdog if how is Detection.WATCHDOG else self.cfg.silent_detection
        every = self.cfg.health_check_every
        if every > 0:
            limit = min(limit, (math.floor(t / every) + 1) * every - t)
        return t + limit

    def ready(self, t: float) -> None:
        if self.fill(t):
            self.job_at(t + self.cfg.requeue, _A_START)
        else:
            self.waiting_nodes = True
            self.node_waits += 1
            self.emit(t, K.SUBMIT)  # requeued, waiting for nodes: badput waiting, whatever stopped the job

    def on_job(self, t: float, gen: int, action: int) -> None:
        if gen != self.gen:
            return
        cfg = self.cfg
        if action == _A_START:
            self.phase = _STARTING
            self.emit(t, K.START if self.attempt == 0 else K.RESTART)
            self.job_at(t + cfg.restart_overhead, _A_INIT)
        elif action == _A_INIT:
            self.emit(t, K.INITIALISED)
            if self.have_ckpt and cfg.restore > 0:
                self.phase = _RESTORING
                self.emit(t, K.RESTORE_START)
                self.job_at(t + cfg.restore, _A_RESTORED)
            else:
                self.enter_train(t)
        elif action == _A_RESTORED:
            self.emit(t, K.RESTORE_END)
            self.enter_train(t)
        elif action == _A_CKPT:
            self.leave_train(t)
            self.phase = _SAVE
            self.since_ckpt = 0.0
            self.ckpt_id += 1
            self.emit(t, K.CHECKPOINT_SAVE_START, ckpt=self.ckpt_id if self.asynchronous else None)
            self.job_at(t + cfg.checkpoint_write, _A_SAVED)
        elif action == _A_SAVED:
            if self.stop_saving:
                self.emit(t, K.CHECKPOINT_SAVE_END)
                self.have_ckpt = True
                self.planned_stop(t)
                return
            self.emit(t, K.CHECKPOINT_SAVE_END, ckpt=self.ckpt_id if self.asynchronous else None)
            if self.asynchronous:
                self.push(t + cfg.checkpoint_persist, _PERSIST, self.attempt, self.ckpt_id)
            else:
                self.have_ckpt = True
            if self.live_pending() and not self.asynchronous:
                self.planned_stop(t)
            else:
                self.enter_train(t)
        elif action == _A_CHECK:
            self.leave_train(t)
            self.phase = _CHECK
            self.emit(t, K.HEALTH_CHECK_START)
            self.job_at(t + cfg.health_check_cost, _A_CHECKED)
        elif action == _A_CHECKED:
            self.emit(t, K.HEALTH_CHECK_END)
            self.enter_train(t)
        elif action == _A_DETECTED:
            self.emit(t, K.DETECTED)
            self.ready(t)
        elif action == _A_READY:
            self.ready(t)

    def request_stop(self, t: float, cause: str, node: int) -> None:
        if node < 0 and not self.running:
            return  # planned work while the job is down anyway costs the job nothing
        self.pending.append((cause, node, self.epoch[node] if node >= 0 else 0))
        if self.phase == _TRAIN:
            self.begin_stop_save(t)

    # ---- fault handling -------------------------------------------------------------------------
    def on_fail(self, t: float, node: int, epoch: int, cat: FailureCategory) -> None:
        if node < 0:  # job-scope fault
            if self.running:
                self.fail(t, cat)
            return
        if self.epoch[node] != epoch or self.status[node] == _REPAIR:
            return  # the node was taken out before the fault struck
        self.node_fault(t, node, cat)

    def node_fault(self, t: float, node: int, cat: FailureCategory, duration: float | None = None,
                   cause: str | None = None) -> None:
        in_job = self.status[node] == _IN_JOB
        if self.cfg.repair_escape > 0:
            self.last_fault[node] = cat
        verdict = self.control.fault(self.name(node), cat, t, in_job)
        if in_job and self.running:
            self.fail(t, cat, cause)
        if verdict is Verdict.HELD:
            # The node is dead to the job (the scheduler marks it down), but the controller's drain
            # is held by the blast-radius breaker: repair starts only once an operator releases it.
            wait = max(0.0, self.control.hold_until(t) - t)
            d = self.cfg.repair.sample(self.rng) if duration is None else duration
            self.held_faults += 1
            self.to_repair(t, node, wait + d)
        elif verdict is not Verdict.KEEP:
            self.to_repair(t, node, duration)

    def on_warn(self, t: float, node: int, epoch: int, cat: FailureCategory) -> None:
        if self.epoch[node] != epoch or self.status[node] == _REPAIR:
            return
        verdict = self.control.warning(self.name(node), cat, t, self.status[node] == _IN_JOB)
        if verdict in (Verdict.KEEP, Verdict.HELD):
            return
        if self.status[node] == _SPARE or not self.running:
            if verdict is Verdict.DRAIN_AT_CHECKPOINT:
                self.control.drained(self.name(node), t)
            self.to_repair(t, node)
        elif verdict is Verdict.DRAIN_NOW:
            self.fail(t, cat, DRAIN_CAUSE)
            self.to_repair(t, node)
        else:
            self.request_stop(t, DRAIN_CAUSE, node)

    def on_trace(self, t: float, node: int, fault: tuple[str, Effect, float]) -> None:
        category, effect, duration = fault
        if self.unlimited:
            if node >= self.j:
                return
            node = self.pool.slots[node]
            if node < 0:
                return
        elif node >= len(self.status):
            return
        if self.status[node] == _REPAIR:
            return
        cat = _trace_category(category)
        if effect is Effect.INTERRUPT:
            self.node_fault(t, node, cat, duration, category)
        elif effect is Effect.DEGRADED:
            if self.status[node] == _IN_JOB and self.running:
                self.request_stop(t, f"degraded:{category}", node)
                self.trace_repair[node] = t + duration
            else:
                self.to_repair(t, node, duration)
        elif self.status[node] == _SPARE:  # burn-in findings never hit the job
            self.to_repair(t, node, duration)

    # ---- main loop ------------------------------------------------------------------------------
    def run(self) -> ReplicaResult:
        cfg = self.cfg
        self.draw_next(0.0)
        planned_rate = cfg.planned_per_node_day * self.j / 86400.0
        if planned_rate > 0:
            self.push(self.rng.expovariate(planned_rate), _PLANNED)
        if self.trace is not None:
            self._load_trace()
        pool = self.pool
        self.control.start([(pool.name(n), pool.domains(n, pool.slot_of[n])) for n in range(len(pool))], 0.0)
        self.job_at(0.0, _A_START)
        heap = self.heap
        while heap:
            t, _, kind, a, b, c = heapq.heappop(heap)
            self.events += 1
            if kind == _JOB:
                self.on_job(t, a, b)
            elif kind == _DRAW:
                assert isinstance(c, float)
                self.on_draw(t, c)
            elif kind == _FAIL:
                assert isinstance(c, FailureCategory)
                self.on_fail(t, a, b, c)
            elif kind == _PERSIST:
                if a == self.attempt:
                    self.emit(t, K.CHECKPOINT_PERSISTED, ckpt=b)
                    self.have_ckpt = True
            elif kind == _REPAIRED:
                self.on_repaired(t, a, b)
            elif kind == _VALIDATED:
                self.on_validated(t, a, b, bool(c))
            elif kind == _WARN:
                assert isinstance(c, FailureCategory)
                self.on_warn(t, a, b, c)
            elif kind == _PLANNED:
                self.push(t + self.rng.expovariate(planned_rate), _PLANNED)
                self.request_stop(t, PLANNED_CAUSE, -1)
            elif kind == _TRACE:
                assert isinstance(c, tuple)
                self.on_trace(t, a, c)
        self.emit(self.horizon, K.END)
        report = compute(JobTimeline(tuple(self.tl)))
        return ReplicaResult(0, report, self.events, len(self.tl), self.control.calls, self.node_waits,
                             self.pool.peak_in_repair, self.held_faults, self.escapes)

    def _load_trace(self) -> None:
        assert self.trace is not None
        ids = self.trace.node_ids()
        positions = list(range(self.trace.nodes))
        self.rng.shuffle(positions)
        where = {nid: positions[i] for i, nid in enumerate(ids)}
        for f in self.trace.faults:
            self.push(f.start, _TRACE, where[f.node], 0, (f.category, f.effect, f.duration))


_ESCAPE = FailureCategory("repair_escape", "Repair", 0.0)


def _trace_category(name: str) -> FailureCategory:
    cat = _TRACE_CATS.get(name)
    if cat is None:
        cat = _TRACE_CATS[name] = FailureCategory(name, "trace", 0.0)
    return cat


_TRACE_CATS: dict[str, FailureCategory] = {}


def run_replica(cfg: SimConfig, seed: int, *, control: NodeControl | None = None,
                trace: FaultTrace | None = None) -> ReplicaResult:
    """Simulate one campaign with random seed ``seed``."""
    ctl = control if control is not None else LifecycleControl(
        proactive_drain=cfg.proactive_drain, operator_response=cfg.operator_response)
    res = _Replica(cfg, seed, ctl, trace).run()
    return ReplicaResult(seed, res.report, res.events, res.timeline_events, res.control_calls,
                         res.node_waits, res.peak_in_repair, res.held_faults, res.escapes)
