"""The reconciler against the simulated scheduler: waits, retries, gives up visibly, resists drift."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.faults import NEVER_STARTED, never_ran
from gpufleet.controller.reconciler import Reconciler, backoff
from gpufleet.controller.service import Controller
from gpufleet.controller.store.db import make_engine, migrate
from gpufleet.controller.store.repo import Page, Store
from gpufleet.domain.errors import ExternalError, InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.fleet import simulated_fleet
from gpufleet.lifecycle.config import parse_policy
from gpufleet.lifecycle.engine import OperatorOp
from gpufleet.lifecycle.states import NodeState
from gpufleet.schedulers.port import JobState, RunStatus, SchedNodeState
from gpufleet.schedulers.sim import SimScheduler

T0 = datetime(2026, 11, 21, 12, tzinfo=UTC)


@dataclass
class Rig:
    c: Controller
    r: Reconciler
    s: SimScheduler
    clock: ManualClock
    nodes: list[str]

    def step(self, seconds: float = 1.0) -> None:
        self.clock.advance(timedelta(seconds=seconds))
        self.r.run_once()

    def actions(self, node: str) -> dict[str, str]:
        return {a.kind: a.status for a in self.c.store.actions(node=node, page=Page(1000))}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    engine = make_engine(f"sqlite:///{tmp_path / 'g.db'}")
    migrate(engine)
    clock = ManualClock(T0)
    policy = parse_policy({"breaker": {"max_unavailable_fleet": 1.0, "max_unavailable_domain": 1.0},
                           "policy": {"checkpoint_wait_timeout": "1h", "heartbeat_timeout": "0s"}})
    c = Controller(Store(engine), policy, clock)
    fleet = simulated_fleet(8, 2)
    c.register_fleet(fleet)
    s = SimScheduler([n.id for n in fleet])
    yield Rig(c, Reconciler(c, s), s, clock, [n.id for n in fleet])


def ev(node: str, kind: EventKind, at: datetime, code: int | None = None) -> HealthEvent:
    return HealthEvent(f"{node}-{kind}-{code}-{at.timestamp()}", node, kind, at, f"{node}-gpu0", code)


def test_drain_after_checkpoint_waits_then_drains_and_requeues(rig: Rig) -> None:
    n = rig.nodes[0]
    job = rig.s.submit("train", [n, rig.nodes[1]], start=T0)
    rig.step()
    rig.c.ingest([ev(n, EventKind.XID, rig.clock.now(), 94)])
    assert rig.c.state_of(n) == NodeState.SUSPECT
    rig.step(30)
    assert rig.actions(n) == {"drain_after_checkpoint": "waiting"}
    assert rig.s.node(n).state == SchedNodeState.ALLOCATED, "never drained before the checkpoint"
    rig.s.checkpoint(job.id, rig.clock.now())
    rig.step(31)  # past the poll interval
    assert rig.actions(n) == {"drain_after_checkpoint": "done"}
    assert rig.s.node(n).state == SchedNodeState.DRAINED
    assert {j.id: j for j in rig.s.list_jobs()}[job.id].restarts == 1  # requeued from its checkpoint
    rig.step()
    assert rig.c.state_of(n) in (NodeState.DRAINED, NodeState.REPAIR)


def test_drain_after_checkpoint_gives_up_waiting_after_the_timeout(rig: Rig) -> None:
    n = rig.nodes[0]
    rig.s.submit("train", [n], start=T0)
    rig.step()
    rig.c.ingest([ev(n, EventKind.XID, rig.clock.now(), 94)])
    rig.step(1800)
    assert rig.s.node(n).state == SchedNodeState.ALLOCATED
    rig.step(1900)
    action = next(a for a in rig.c.store.actions(node=n) if a.kind == "drain_after_checkpoint")
    assert action.status == "done" and "no checkpoint within" in action.result


def test_unreachable_scheduler_is_retried_with_backoff_and_visible(rig: Rig) -> None:
    n = rig.nodes[2]
    rig.s.set_reachable(False)
    rig.c.ingest([ev(n, EventKind.XID, T0, 79)])
    rig.step()
    a = next(a for a in rig.c.store.actions(node=n) if a.kind == "drain")
    assert a.status == "pending" and a.attempts == 1 and "unreachable" in a.last_error
    assert a.next_attempt > rig.clock.now()
    assert not rig.r.scheduler_ok
    rig.s.set_reachable(True)
    rig.step(10)
    assert rig.s.node(n).state == SchedNodeState.DRAINED
    drains = [e for e in rig.s.effects if e[0] == "drain" and e[1] == n]
    assert len(drains) == 1


def test_backoff_doubles_to_the_cap_with_bounded_jitter() -> None:
    base, cap = timedelta(seconds=2), timedelta(minutes=5)
    steps = [backoff("a1", k, base, cap).total_seconds() for k in range(1, 12)]
    for k, s in enumerate(steps, start=1):
        full = min(cap.total_seconds(), 2.0 * 2 ** (k - 1))
        assert 0.5 * full <= s <= full
    assert backoff("a1", 3, base, cap) == backoff("a1", 3, base, cap)  # deterministic per (action, attempt)


def test_a_foreign_drain_is_never_resumed_and_the_failure_is_visible(rig: Rig) -> None:
    n = rig.nodes[3]
    rig.c.ingest([ev(n, EventKind.XID, T0, 79)])
    rig.step()
    rig.step()
    assert rig.c.state_of(n) == NodeState.REPAIR
    rig.s.resume(n)  # an admin takes over the node...
    rig.s.drain(n, "admin: replacing the PSU")
    rig.step()
    rig.c.operate(n, OperatorOp.REPAIR_DONE, "alice")
    rig.c.ingest([ev(n, EventKind.CHECK_PASSED, rig.clock.now())])
    rig.step()
    resume = next(a for a in rig.c.store.actions(node=n) if a.kind == "resume")
    assert resume.status == "failed" and "someone else" in resume.last_error
    assert "PSU" in rig.s.node(n).reason


def test_a_lost_drain_is_put_back_and_audited(rig: Rig) -> None:
    n = rig.nodes[4]
    rig.c.ingest([ev(n, EventKind.XID, T0, 79)])
    rig.step()
    rig.step()
    assert rig.c.state_of(n) == NodeState.REPAIR and rig.s.node(n).state == SchedNodeState.DRAINED
    rig.s.resume(n)  # the scheduler forgets the drain (or someone resumes it behind gpufleet's back)
    rig.step()
    assert rig.s.node(n).state == SchedNodeState.DRAINED
    assert rig.s.node(n).reason.startswith("gpufleet:drift")
    audit = [a for a in rig.c.store.audit(target=n) if a.action == "drift_redrain"]
    assert audit and "not revalidated" not in audit[0].detail and "repair" in audit[0].detail
    rig.step()
    assert len([a for a in rig.c.store.audit(target=n) if a.action == "drift_redrain"]) == 1


def test_the_scheduler_is_read_at_most_every_sync_interval_and_actions_still_run_every_pass(rig: Rig) -> None:
    r = Reconciler(rig.c, rig.s, sync_interval=10.0)
    node, other = rig.nodes[0], rig.nodes[1]
    r.run_once()  # the first pass always reads the scheduler
    rig.s.submit("j1", [node], start=rig.clock.now())
    rig.clock.advance(timedelta(seconds=3))
    r.run_once()
    assert rig.c.state_of(node) == NodeState.READY  # the job is not seen yet: no read within 10 s
    rig.c.operate(other, OperatorOp.DRAIN, "operator:alice", "bad fan")
    rig.clock.advance(timedelta(seconds=3))
    r.run_once()
    assert rig.s.node(other).state != SchedNodeState.IDLE  # actions are carried out on every pass
    rig.clock.advance(timedelta(seconds=5))
    r.run_once()  # 11 s after the last read
    assert rig.c.state_of(node) == NodeState.IN_SERVICE


def test_a_negative_sync_interval_is_refused_with_its_name(rig: Rig) -> None:
    with pytest.raises(InvalidInput) as err:
        Reconciler(rig.c, rig.s, sync_interval=-1.0)
    assert (err.value.field, err.value.value) == ("scheduler_sync_interval", -1.0)


@dataclass
class QueuedValidator:
    """A validator whose job waits in the queue for ``reason`` until it is cancelled (the drill: an operator
    drained the node under validation, Slurm keeps the job pending on ReqNodeNotAvail)."""

    reason: str = "ReqNodeNotAvail"
    partners: int = 0
    cancelled: list[str] | None = None

    def request(self, node: str, level: str, key: str, partners: Sequence[str] = ()) -> str:
        return "41"

    def status(self, handle: str) -> RunStatus:
        if self.cancelled:
            return RunStatus(ended=f"job {handle} ended CANCELLED", cancelled=True)
        return RunStatus(pending=self.reason)

    def cancel(self, handle: str) -> None:
        self.cancelled = [*(self.cancelled or []), handle]

    def release(self, node: str) -> None:
        return None

    def holds(self, node: str) -> bool:
        return False


def _revalidating(rig: Rig, v: QueuedValidator) -> str:
    """A node out for an XID 79, put back by an operator: its validation job submitted to ``v``."""
    rig.r.validator = v
    node = rig.nodes[0]
    rig.c.ingest([ev(node, EventKind.XID, T0, 79)])
    rig.step()
    rig.step()
    assert rig.c.state_of(node) in (NodeState.DRAINED, NodeState.REPAIR)
    rig.c.operate(node, OperatorOp.RESUME, "operator:test")
    rig.step()
    return node


def test_a_validation_job_that_never_starts_is_cancelled_at_the_deadline_and_fails(rig: Rig) -> None:
    v = QueuedValidator()
    node = _revalidating(rig, v)
    deadline = rig.c.policy_file.config.validation_start_timeout
    waited = timedelta(0)
    while waited + timedelta(seconds=30) < deadline:  # pending, polled, never past the deadline
        rig.step(30)
        waited += timedelta(seconds=30)
        assert rig.c.state_of(node) == NodeState.REVALIDATE and not v.cancelled
    (a,) = [a for a in rig.c.store.actions(node=node, page=Page(1000)) if a.kind == "validate"]
    assert a.status == "waiting" and a.result.endswith(f"pending ({v.reason})")
    rig.step(60)
    assert v.cancelled == ["41"]
    assert rig.c.state_of(node) == NodeState.REPAIR
    (failed,) = [e for e in rig.c.store.events(node=node, kind="check_failed", page=Page(10))]
    assert f"never started: pending ({v.reason})" in failed.message and str(deadline) in failed.message
    (audit,) = [x for x in rig.c.store.audit(target=node, page=Page(1000)) if x.action == "validation_cancelled"]
    assert "job 41" in audit.detail and v.reason in audit.detail
    rig.step(60)
    assert v.cancelled == ["41"], "cancelled once"


@dataclass
class LostAfterCancel(QueuedValidator):
    """The job is cancelled, then the controller loses the rest of the pass (its database went away, or
    the process died: the next pass is all that follows)."""

    lost: int = 1

    def cancel(self, handle: str) -> None:
        super().cancel(handle)
        if self.lost:
            self.lost -= 1
            raise ExternalError("database", "connection lost after scancel")


def test_a_pass_lost_after_the_cancel_still_fails_the_validation_as_one_that_never_ran(rig: Rig) -> None:
    v = LostAfterCancel()
    node = _revalidating(rig, v)
    deadline = rig.c.policy_file.config.validation_start_timeout
    rig.step(deadline.total_seconds())
    assert v.cancelled == ["41"] and not v.lost, "cancelled, then the pass was lost"
    assert rig.c.state_of(node) == NodeState.REVALIDATE and not rig.c.store.events(node=node, kind="check_failed",
                                                                                   page=Page(10))
    rig.step(600)  # the retry: the job reads "ended CANCELLED" now
    assert rig.c.state_of(node) == NodeState.REPAIR
    (failed,) = rig.c.store.events(node=node, kind="check_failed", page=Page(10))
    assert failed.attrs.get(NEVER_STARTED) == v.reason, failed.attrs
    assert f"never started: pending ({v.reason})" in failed.message
    (d,) = [d for d in rig.c.store.decisions(node=node, page=Page(100)) if d.rule == "validation_failed"]
    assert never_ran(rig.c, d.id) == failed.message, "the repair ladder does not count it as the fault again"


@dataclass
class CancelFailsThenJobRuns(QueuedValidator):
    """scancel fails once (slurmctld unreachable) and never took effect; meanwhile the job starts (the
    node was freed) and, in one case, runs and fails."""

    started: bool = False
    ended: str | None = None
    cancel_tries: int = 0

    def status(self, handle: str) -> RunStatus:
        if self.cancelled:
            return RunStatus(ended=f"job {handle} ended CANCELLED", cancelled=True)
        if self.ended:
            return RunStatus(ended=self.ended)
        return RunStatus() if self.started else RunStatus(pending=self.reason)

    def cancel(self, handle: str) -> None:
        self.cancel_tries += 1
        if self.cancel_tries == 1:
            raise ExternalError("slurm", "scancel: Unable to contact slurm controller")
        super().cancel(handle)


def test_a_job_that_starts_after_its_cancel_failed_is_followed_not_cancelled(rig: Rig) -> None:
    """A review's case: the mark is the intent to cancel, not a fact about the run: a job that started
    (or ran and failed) because the cancel never took is the validation, and is judged as one."""
    v = CancelFailsThenJobRuns()
    node = _revalidating(rig, v)
    rig.step(rig.c.policy_file.config.validation_start_timeout.total_seconds())
    assert v.cancel_tries == 1 and not v.cancelled, "the cancel failed: the job is still queued"
    v.started = True
    rig.step(600)
    assert not v.cancelled and rig.c.state_of(node) == NodeState.REVALIDATE, "a running validation cancelled"
    v.ended = "job 41 ended FAILED (exit 1)"  # it ran on the node and failed: the fault is back
    rig.step(600)
    (failed,) = rig.c.store.events(node=node, kind="check_failed", page=Page(10))
    assert NEVER_STARTED not in failed.attrs and "FAILED" in failed.message, failed.message
    (d,) = [d for d in rig.c.store.decisions(node=node, page=Page(100)) if d.rule == "validation_failed"]
    assert never_ran(rig.c, d.id) == "", "a run that ran and failed climbs the ladder"


def test_a_job_still_queued_after_its_cancel_failed_is_cancelled_at_the_next_pass(rig: Rig) -> None:
    v = CancelFailsThenJobRuns()
    node = _revalidating(rig, v)
    rig.step(rig.c.policy_file.config.validation_start_timeout.total_seconds())
    rig.step(600)
    assert v.cancel_tries == 2 and v.cancelled == ["41"]
    (failed,) = rig.c.store.events(node=node, kind="check_failed", page=Page(10))
    assert failed.attrs.get(NEVER_STARTED) == v.reason


def test_a_drift_redrain_keeps_the_reason_the_node_had_and_a_second_one_does_not_nest_it(rig: Rig) -> None:
    n = rig.nodes[4]
    rig.c.ingest([ev(n, EventKind.XID, T0, 79)])
    rig.step()
    rig.step()
    first = rig.s.node(n).reason
    assert first.startswith("gpufleet:d-")
    for _ in range(2):  # resumed behind gpufleet's back twice: the reason it had the first time is kept
        rig.s.resume(n)
        rig.step()
        assert rig.s.node(n).reason == f"gpufleet:drift repair: not revalidated; before: {first}"
        rig.step()  # a pass that sees it drained again


def test_a_drain_of_a_node_someone_set_down_keeps_their_reason_after_gpufleets(rig: Rig) -> None:
    """The simulated scheduler as Slurm's adapter (decision 0131): a fatal fault on a node an operator had set
    down drains it, and their reason stays after gpufleet's."""
    n = rig.nodes[6]
    job = rig.s.submit("train", [n], start=T0)
    rig.s.set_down(n, "jdoe: PSU dead")
    assert rig.s.job(job.id).state == JobState.FAILED, "Slurm ends the jobs of a node set down (NODE_FAIL)"
    assert rig.s.node(n).state == SchedNodeState.DOWN and not rig.s.node(n).drained_by_us
    rig.c.ingest([ev(n, EventKind.XID, T0, 79)])
    rig.step()
    got = rig.s.node(n)
    assert got.reason.startswith("gpufleet:d-") and got.reason.endswith("; before: jdoe: PSU dead"), got.reason
    # read as Slurm shows DOWN+DRAIN (tests/integration/slurm/test_adapter_real.py, the same case on `ghost`)
    assert got.state == SchedNodeState.DRAINED and got.drained_by_us, got


def test_a_reason_seen_while_out_is_forgotten_once_the_node_is_back_in_service(rig: Rig) -> None:
    """A review's case: the reason remembered for a drift re-drain must be the current outage's, not last
    month's: an operator's drain and resume of a node gpufleet keeps serving leave nothing behind."""
    n = rig.nodes[5]
    rig.s.drain(n, "ticket 123: PSU")
    rig.step()
    assert rig.r._out_reason.get(n) == "ticket 123: PSU"  # remembered while the node is out
    back = rig.s._get(n)  # the operator's own resume (the simulated one resumes only gpufleet's drains)
    back.drain, back.reason = False, ""
    rig.step()
    assert n not in rig.r._out_reason and rig.c.state_of(n) == NodeState.READY


def test_a_database_outage_is_one_traceback_and_one_line_when_it_is_over_not_one_per_pass(
        rig: Rig, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A drill: a 30 s PostgreSQL outage logged a traceback at every reconciler pass. The loop runs 200
    passes whose store read fails as a lost connection does, then one that works."""
    import logging
    import threading

    from sqlalchemy.exc import OperationalError

    real, stop, passes = rig.c.store.due_actions, threading.Event(), [0]

    def due_actions(now: datetime) -> object:
        passes[0] += 1
        if passes[0] <= 200:
            raise OperationalError("SELECT ...", {}, Exception("connection refused"))
        stop.set()  # the pass after this one never starts
        return real(now)

    monkeypatch.setattr(rig.c.store, "due_actions", due_actions)
    with caplog.at_level(logging.INFO, logger="gpufleet.controller.reconciler"):
        rig.r.run_forever(stop, interval=0)
    records = [r for r in caplog.records if r.name == "gpufleet.controller.reconciler"]
    assert passes[0] == 201
    assert len(records) <= 3, [r.getMessage() for r in records]  # the first, a count if a minute passed, "again"
    assert records[0].exc_info is not None and "connection refused" in records[0].getMessage()
    assert records[-1].getMessage().startswith("reconciler pass: working again after 200 failure(s)"), \
        records[-1].getMessage()
