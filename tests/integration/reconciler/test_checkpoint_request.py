"""Drain after checkpoint, asking the job first: one request, a GPU-hours deadline, crash-safe."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.reconciler import Reconciler
from gpufleet.controller.service import Controller
from gpufleet.controller.store.db import make_engine, migrate
from gpufleet.controller.store.models import ActionRow
from gpufleet.controller.store.repo import Page, Store
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.fleet import simulated_fleet
from gpufleet.lifecycle.config import parse_policy
from gpufleet.lifecycle.states import NodeState
from gpufleet.schedulers.port import SchedNodeState
from gpufleet.schedulers.sim import SimScheduler

T0 = datetime(2026, 11, 21, 12, tzinfo=UTC)
POLICY = {"breaker": {"max_unavailable_fleet": 1.0, "max_unavailable_domain": 1.0},
          "policy": {"checkpoint_wait_timeout": "12h", "checkpoint_grace": "10m", "checkpoint_risk_budget": 64,
                     "checkpoint_poll": "30s", "heartbeat_timeout": "0s", "auto_repair": False}}


class World:
    """A controller and reconciler over one SQLite file; ``restart`` builds new ones on the same file
    (what a SIGKILLed controller finds when it comes back)."""

    def __init__(self, tmp: Path) -> None:
        self.url = f"sqlite:///{tmp / 'g.db'}"
        self.clock = ManualClock(T0)
        self.fleet = simulated_fleet(4, 1)
        self.ids = [n.id for n in self.fleet]
        self.s = SimScheduler(self.ids)
        self.restart()
        self.c.register_fleet(self.fleet)

    def restart(self) -> None:
        engine = make_engine(self.url)
        migrate(engine)
        self.c = Controller(Store(engine), parse_policy(POLICY), self.clock)
        self.r = Reconciler(self.c, self.s)

    def step(self, seconds: float) -> None:
        self.clock.advance(timedelta(seconds=seconds))
        self.r.run_once()

    def action(self, node: str) -> ActionRow:
        return next(a for a in self.c.store.actions(node=node, page=Page(100)) if a.kind == "drain_after_checkpoint")

    def degrade(self, node: str) -> None:
        self.c.ingest([HealthEvent(f"{node}-94", node, EventKind.XID, self.clock.now(), f"{node}-gpu0", 94)])


def test_job_is_asked_once_and_drained_after_the_checkpoint_it_reports(tmp_path: Path) -> None:
    w = World(tmp_path)
    n = w.ids[0]
    job = w.s.submit("train", [n, w.ids[1]], start=T0, checkpoint_signal="USR1")
    w.step(3600)  # an hour of training, never checkpointed
    w.degrade(n)
    for _ in range(5):
        w.step(30)
    a = w.action(n)
    assert a.status == "waiting" and w.s.checkpoint_requests(job.id) == 1
    assert a.progress is not None
    assert a.progress["gpus"] == "16" and a.progress["signal"] == "USR1"  # 2 nodes x gpus_per_node 8
    # 16 GPUs since T0: the 64 GPU-hour budget is used up 4 h after T0.
    assert a.progress["deadline"] == (T0 + timedelta(hours=4)).isoformat()
    assert float(a.progress["gpu_hours_at_risk"]) > 16.0
    audit = [x.detail for x in w.c.store.audit(target=n) if x.action == "checkpoint_request"]
    assert len(audit) == 1 and "16 GPUs" in audit[0]
    w.s.checkpoint(job.id, w.clock.now())
    w.step(30)
    assert w.action(n).status == "done" and w.action(n).result.startswith("drained after checkpoint at")
    assert w.s.node(n).state == SchedNodeState.DRAINED
    assert {j.id: j for j in w.s.list_jobs()}[job.id].restarts == 1


def test_a_job_that_never_checkpoints_is_drained_at_the_budget_deadline(tmp_path: Path) -> None:
    w = World(tmp_path)
    n = w.ids[2]
    job = w.s.submit("train", [n], start=T0, checkpoint_signal="USR1")  # 8 GPUs: 64 GPU-hours at T0 + 8 h
    w.step(60)
    w.degrade(n)
    w.step(1)
    deadline = T0 + timedelta(hours=8)
    w.step((deadline - w.clock.now()).total_seconds() - 1)
    assert w.action(n).status == "waiting" and w.s.node(n).state == SchedNodeState.ALLOCATED
    w.step(31)
    a = w.action(n)
    assert a.status == "done" and "GPU-hours at risk, budget 64" in a.result, a.result
    assert w.s.node(n).state == SchedNodeState.DRAINED
    assert w.s.checkpoint_requests(job.id) == 1


def test_a_restart_while_waiting_resumes_the_wait_without_asking_again(tmp_path: Path) -> None:
    w = World(tmp_path)
    n = w.ids[3]
    job = w.s.submit("train", [n], start=T0, checkpoint_signal="USR1")
    w.step(60)
    w.degrade(n)
    w.step(1)
    before = w.action(n).progress
    assert w.s.checkpoint_requests(job.id) == 1
    w.restart()  # the controller died while waiting; a new one reads the outbox
    for _ in range(3):
        w.step(30)
    assert w.s.checkpoint_requests(job.id) == 1, "the request is never sent twice"
    after = w.action(n).progress
    assert after is not None and before is not None and after["deadline"] == before["deadline"]
    assert w.c.state_of(n) == NodeState.SUSPECT
    w.s.checkpoint(job.id, w.clock.now())
    w.step(30)
    assert w.s.node(n).state == SchedNodeState.DRAINED
    assert [e for e in w.s.effects if e[0] == "requeue"] == [("requeue", job.id, "")]


def test_an_unreachable_scheduler_when_asking_is_retried_and_asks_once(tmp_path: Path) -> None:
    w = World(tmp_path)
    n = w.ids[1]
    job = w.s.submit("train", [n], start=T0, checkpoint_signal="USR1")
    w.step(60)
    w.degrade(n)
    w.s.set_reachable(False)
    w.step(1)
    a = w.action(n)
    assert a.status == "pending" and a.attempts == 1 and not a.progress
    w.s.set_reachable(True)
    w.step(30)
    assert w.action(n).status == "waiting" and w.s.checkpoint_requests(job.id) == 1


def test_a_job_that_did_not_opt_in_is_not_signalled_and_is_drained_at_the_deadline(tmp_path: Path) -> None:
    """No ``checkpoint_signal`` declared and no site-wide default: asking could kill the job (USR1's
    default action), so it is not asked; the node still drains at the GPU-hours deadline."""
    w = World(tmp_path)
    n = w.ids[0]
    job = w.s.submit("train", [n], start=T0)
    w.step(60)
    w.degrade(n)
    w.step(1)
    a = w.action(n)
    assert a.status == "waiting" and a.progress["signal"] == "" and w.s.checkpoint_requests(job.id) == 0
    asked = [x for x in w.c.store.audit(target=n, page=Page(50)) if x.action == "checkpoint_request"]
    (signal,) = [x for x in w.c.store.audit(target=n, page=Page(50)) if x.action == "checkpoint_signal"]
    assert len(asked) == 1 and f"job {job.id} declared no checkpoint signal: not asked" in signal.detail
    w.step((T0 + timedelta(hours=8) - w.clock.now()).total_seconds() + 30)
    a = w.action(n)
    assert a.status == "done" and a.result.endswith(f"requeued {job.id}"), a.result
    assert w.s.node(n).state == SchedNodeState.DRAINED and w.s.checkpoint_requests(job.id) == 0


def test_the_request_is_audited_with_its_wait_before_the_signal_is_sent(tmp_path: Path) -> None:
    """A controller killed right after the signal (tests/e2e/test_loop_crash.py) must still have the
    audit line saying it asked: the line is written with the wait, before any signal."""
    w = World(tmp_path)
    n = w.ids[0]
    job = w.s.submit("train", [n], start=T0, checkpoint_signal="USR1")
    seen_at_signal: list[list[str]] = []
    send = w.s.request_checkpoint

    def observed(job_id: str) -> str:  # what the store holds at the moment the signal goes out
        seen_at_signal.append([x.action for x in w.c.store.audit(target=n, page=Page(50))])
        return send(job_id)

    w.s.request_checkpoint = observed  # type: ignore[method-assign]
    w.step(3600)
    w.degrade(n)
    for _ in range(3):
        w.step(30)
    assert w.s.checkpoint_requests(job.id) == 1
    (at_signal,) = seen_at_signal
    assert "checkpoint_request" in at_signal and "checkpoint_signal" not in at_signal
    after = [x.action for x in w.c.store.audit(target=n, page=Page(50))]
    assert after.count("checkpoint_request") == 1 and after.count("checkpoint_signal") == 1
