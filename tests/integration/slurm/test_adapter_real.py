"""Slurm-only adapter operations and failure behaviour against the real lab."""

from __future__ import annotations

import pytest

from gpufleet.domain.errors import ExternalError, NotFound
from gpufleet.schedulers.port import JobState, SchedNodeState, drain_reason
from gpufleet.schedulers.slurm import SlurmScheduler
from tests.integration.slurm.lab import SlurmLab, wait_for

pytestmark = pytest.mark.slurm


def test_features_and_weight_round_trip(lab: SlurmLab, sched: SlurmScheduler) -> None:
    sched.set_features("n2", ["gpu", "h100", "gpufleet-suspect"])
    sched.set_weight("n2", 500)
    n = sched.slurm_node("n2")
    assert n.features == ("gpu", "h100", "gpufleet-suspect") and n.active_features == n.features
    assert n.weight == 500
    assert {x.name: x for x in sched.slurm_nodes()}["n2"].weight == 500
    sched.set_features("n2", ["gpu", "h100"])
    sched.set_weight("n2", 10)
    assert sched.slurm_node("n2").weight == 10


def test_hold_and_release(lab: SlurmLab, sched: SlurmScheduler) -> None:
    sched.drain("n1", drain_reason("d-h", "keep the job pending"))
    job = lab.sbatch("n1", "sleep 1")
    sched.hold(job)
    assert dict(sched.job(job).extra)["state_reason"] == "JobHeldAdmin"
    sched.release(job)
    assert dict(sched.job(job).extra)["state_reason"] != "JobHeldAdmin"
    with pytest.raises(NotFound):
        sched.hold("999999")


def test_signal_reaches_the_batch_script(lab: SlurmLab, sched: SlurmScheduler) -> None:
    flag, trapped = lab.root / "jobs" / "got-usr1", lab.root / "jobs" / "usr1-trapped"
    job = lab.sbatch("n1", f"trap 'touch {flag}' USR1; touch {trapped}; while true; do sleep 0.2; done")
    # Signal only once the script has set its trap: slurmctld says RUNNING before slurmd has launched the
    # batch step (a signal then is "Invalid job id"), and a USR1 before the trap ends the script.
    wait_for(trapped.exists, "the batch script running with its trap set")
    wait_for(lambda: (sched.signal(job, "USR1"), flag.exists())[1], "USR1 delivered to the batch script")


def test_node_without_slurmd_drains_and_resumes(lab: SlurmLab, sched: SlurmScheduler) -> None:
    sched.drain("ghost", drain_reason("d-g", "no slurmd here"))
    assert sched.node("ghost").state == SchedNodeState.DRAINED and sched.node("ghost").drained_by_us
    sched.resume("ghost")  # Slurm answers "Invalid node state specified" but clears DRAIN
    assert "DRAIN" not in sched.slurm_node("ghost").flags


def test_a_drain_of_a_node_an_operator_set_down_keeps_their_reason_after_ours(
        lab: SlurmLab, sched: SlurmScheduler) -> None:
    """A review's case: Slurm replaces a DOWN node's reason with the drain's, so gpufleet's drain of a node an
    operator had set down erased their words (and, the reason now gpufleet's, made it look like gpufleet's
    own outage). The drain keeps them after gpufleet's reason, as a drift re-drain does (0128). ``ghost``
    has no slurmd: it stays down (a live node comes back at its next registration, ReturnToService=2)."""
    theirs = "jdoe: PSU dead, RMA 4411"
    lab.cmd("scontrol", "update", "nodename=ghost", "state=down", f"reason={theirs}")
    try:
        assert sched.node("ghost").state == SchedNodeState.DOWN and sched.node("ghost").reason == theirs
        ours = drain_reason("d-down", "xid 79 gpu fell off the bus")
        assert sched.drain("ghost", ours) is True
        n = sched.slurm_node("ghost")
        assert n.base_state == "down" and "DRAIN" in n.flags, n
        assert n.reason == f"{ours}; before: {theirs}", n.reason
        assert sched.node("ghost").drained_by_us, "the drain is gpufleet's: revalidation resumes it"
        assert sched.drain("ghost", drain_reason("d-other", "again")) is False
        assert sched.slurm_node("ghost").reason == f"{ours}; before: {theirs}", "a second drain changes nothing"
    finally:
        lab.cmd("scontrol", "update", "nodename=ghost", "state=resume", check=False)


def test_unreachable_controller_then_retry_applies_once(lab: SlurmLab, sched: SlurmScheduler) -> None:
    job = lab.sbatch("n3")
    wait_for(lambda: lab.job_state(job) == "RUNNING", "job running")
    lab.wait_job_saved(job)  # a crash must not lose the job's start
    lab.script("ctld-stop")
    try:
        for call in (sched.list_nodes, sched.list_jobs, lambda: sched.drain("n3", drain_reason("d-u", "xid 79"))):
            with pytest.raises(ExternalError) as err:
                call()
            assert err.value.retryable
    finally:
        lab.script("ctld-start")
    wait_for(lambda: _reachable(sched), "controller answers again")
    reason = drain_reason("d-u", "xid 79")
    sched.drain("n3", reason)
    sched.drain("n3", reason)  # a second retry of the same action
    sched.requeue(job)
    sched.requeue(job)
    assert sched.node("n3").reason == reason
    wait_for(lambda: sched.job(job).state == JobState.PENDING, "requeued job pending (after COMPLETING)")
    assert sched.job(job).restarts == 1
    log = (lab.root / "log" / "slurmctld.log").read_text()
    assert log.count(f"node n3 reason set to: {reason}") == 1


def _reachable(sched: SlurmScheduler) -> bool:
    try:
        sched.list_nodes()
    except ExternalError:
        return False
    return True
