"""The scheduler port contract (see gpufleet.schedulers.port): every implementation passes it."""

from __future__ import annotations

import pytest

from gpufleet.domain.errors import Conflict, NotFound
from gpufleet.schedulers.port import JobState, SchedNodeState, Scheduler, drain_reason
from tests.contract.harness import SchedulerHarness


def test_implements_protocol(harness: SchedulerHarness) -> None:
    assert isinstance(harness.scheduler, Scheduler)


def test_lists_its_nodes_idle(harness: SchedulerHarness) -> None:
    listed = {n.name: n for n in harness.scheduler.list_nodes()}
    for name in harness.nodes:
        assert name in listed
        assert listed[name].state == SchedNodeState.IDLE, listed[name]


def test_drain_then_resume_round_trip_with_reason(harness: SchedulerHarness) -> None:
    s, node = harness.scheduler, harness.nodes[0]
    reason = drain_reason("d-123", "xid 79 gpu fell off the bus")
    s.drain(node, reason)
    harness.eventually(lambda: s.node(node).state == SchedNodeState.DRAINED, "node shows DRAINED")
    view = s.node(node)
    assert view.reason.startswith("gpufleet:d-123")
    assert view.drained_by_us and not view.foreign_drain
    s.resume(node)
    harness.eventually(lambda: s.node(node).state == SchedNodeState.IDLE, "node back to IDLE")


def test_drain_is_idempotent(harness: SchedulerHarness) -> None:
    s, node = harness.scheduler, harness.nodes[1]
    reason = drain_reason("d-7", "row remap failure")
    assert s.drain(node, reason) is True, "the drain that changed the node says so"
    assert s.drain(node, reason) is False, "a drain of a node already drained changes nothing and says so"
    harness.eventually(lambda: s.node(node).state == SchedNodeState.DRAINED, "drained")
    assert s.node(node).reason.startswith("gpufleet:d-7")
    s.resume(node)
    s.resume(node)  # resuming an undrained node is a no-op
    harness.eventually(lambda: s.node(node).state == SchedNodeState.IDLE, "idle")


def test_drain_with_running_job_shows_draining_and_keeps_job(harness: SchedulerHarness) -> None:
    s, node = harness.scheduler, harness.nodes[2]
    job = harness.start_job(node)
    assert job in [j.id for j in s.jobs_on(node)]
    s.drain(node, drain_reason("d-9", "suspect"))
    harness.eventually(lambda: s.node(node).state == SchedNodeState.DRAINING, "DRAINING while job runs")
    assert job in [j.id for j in s.jobs_on(node)], "a drain never kills running work"
    harness.end_job(job)
    harness.eventually(lambda: s.node(node).state == SchedNodeState.DRAINED, "DRAINED once empty")
    s.resume(node)
    harness.eventually(lambda: s.node(node).state == SchedNodeState.IDLE, "idle")


def test_foreign_drain_is_respected(harness: SchedulerHarness) -> None:
    s, node = harness.scheduler, harness.nodes[0]
    harness.foreign_drain(node, "admin: replacing PSU")
    harness.eventually(lambda: s.node(node).state == SchedNodeState.DRAINED, "drained by admin")
    assert s.node(node).foreign_drain
    with pytest.raises(Conflict):
        s.resume(node)
    assert s.node(node).state == SchedNodeState.DRAINED
    # Draining it ourselves keeps the admin's reason (the node is out either way).
    assert s.drain(node, drain_reason("d-1", "xid 48")) is False
    assert "PSU" in s.node(node).reason


def test_unknown_node_is_not_found(harness: SchedulerHarness) -> None:
    s = harness.scheduler
    with pytest.raises(NotFound):
        s.node("no-such-node-xyz")
    with pytest.raises(NotFound):
        s.drain("no-such-node-xyz", drain_reason("d-0", "x"))


def test_a_job_is_read_by_its_id_as_the_list_shows_it_and_an_unknown_one_is_not_found(
        harness: SchedulerHarness) -> None:
    """``job`` is how the controller looks a job up (a checkpoint report, its events): one job, never the
    whole queue (docs/scale.md#jobs-at-scale), the same job ``list_jobs`` shows."""
    s, node = harness.scheduler, harness.nodes[0]
    job = harness.start_job(node)
    got = s.job(job)
    assert got.state == JobState.RUNNING and node in got.nodes
    assert got == {j.id: j for j in s.list_jobs()}[job]
    with pytest.raises(NotFound):
        s.job("999999")
    harness.end_job(job)
    try:
        ended = s.job(job)
    except NotFound:  # forgotten at once (Kubernetes) or after a while (Slurm's MinJobAge)
        return
    assert ended.state != JobState.RUNNING


def test_nodes_listed_without_jobs_still_show_which_run_one(harness: SchedulerHarness) -> None:
    """``list_nodes(jobs=False)`` (the reconciler's every-pass read) may leave out the job ids; the state
    still tells a node running a job (ALLOCATED) from an idle one."""
    s, node = harness.scheduler, harness.nodes[1]
    job = harness.start_job(node)
    bare = {n.name: n for n in s.list_nodes(jobs=False)}
    assert bare[node].state == SchedNodeState.ALLOCATED and bare[node].jobs in ((), (job,))
    assert all(bare[n].state == SchedNodeState.IDLE for n in harness.nodes if n != node)
    harness.end_job(job)
    harness.eventually(lambda: {n.name: n for n in s.list_nodes(jobs=False)}[node].state == SchedNodeState.IDLE,
                       "the node idle again once its job ended")


def test_requeue_moves_job_off_the_node(harness: SchedulerHarness) -> None:
    s, node = harness.scheduler, harness.nodes[1]
    job = harness.start_job(node)
    s.drain(node, drain_reason("d-2", "fatal: xid 79"))  # keep the job from restarting here
    s.requeue(job)
    harness.eventually(lambda: job not in [j.id for j in s.jobs_on(node)], "job no longer on node")
    harness.eventually(lambda: s.node(node).state == SchedNodeState.DRAINED, "node drained and empty")
    listed = {j.id: j for j in s.list_jobs()}
    assert job in listed and listed[job].restarts >= 1
    s.resume(node)


def test_checkpoint_request_reaches_the_running_job_and_keeps_it_running(harness: SchedulerHarness) -> None:
    s, node = harness.scheduler, harness.nodes[2]
    job = harness.start_checkpointing_job(node)
    assert not harness.checkpoint_requested(job)
    assert {j.id: j for j in s.list_jobs()}[job].checkpoint_signal == "USR1"  # what the job declared
    sent = s.request_checkpoint(job)
    assert sent == "USR1"
    harness.eventually(lambda: harness.checkpoint_requested(job), "the job saw the checkpoint request")
    assert job in [j.id for j in s.jobs_on(node)], "a checkpoint request never ends the job"
    harness.end_job(job)


def test_checkpoint_request_for_a_job_not_running_is_not_found(harness: SchedulerHarness) -> None:
    s, node = harness.scheduler, harness.nodes[0]
    with pytest.raises(NotFound):
        s.request_checkpoint("999999")
    job = harness.start_job(node)
    harness.end_job(job)
    with pytest.raises(NotFound):
        s.request_checkpoint(job)


def test_a_job_that_declared_no_checkpoint_signal_is_not_signalled(harness: SchedulerHarness) -> None:
    """Opt-in: a signal a job does not handle can kill it (USR1's default action), so with no site-wide
    default a job that declared nothing is never signalled; it keeps running (drained at the deadline)."""
    s, node = harness.scheduler, harness.nodes[1]
    job = harness.start_job(node)
    assert {j.id: j for j in s.list_jobs()}[job].checkpoint_signal == ""
    assert s.request_checkpoint(job) == ""
    assert not harness.checkpoint_requested(job)
    assert job in [j.id for j in s.jobs_on(node)], "the job was not touched"
    harness.end_job(job)


def test_place_last_round_trip_is_idempotent_and_leaves_the_node_schedulable(harness: SchedulerHarness) -> None:
    s, node, other = harness.scheduler, harness.nodes[1], harness.nodes[0]
    assert not s.node(node).placed_last
    s.place_last(node, True)
    s.place_last(node, True)
    harness.eventually(lambda: s.node(node).placed_last, "node shows placed_last")
    assert s.node(node).state == SchedNodeState.IDLE, "kept last, not drained"
    assert not s.node(other).placed_last
    listed = {n.name: n for n in s.list_nodes()}
    assert listed[node].placed_last and not listed[other].placed_last
    s.place_last(node, False)
    s.place_last(node, False)
    harness.eventually(lambda: not s.node(node).placed_last, "node placed normally again")
    with pytest.raises(NotFound):
        s.place_last("no-such-node-xyz", True)
