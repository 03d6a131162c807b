"""End to end on real Slurm: events posted to the controller -> decisions -> the Slurm adapter acts."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.schedulers.port import JobState
from gpufleet.schedulers.slurm import SlurmScheduler
from tests.integration.slurm.controller import AGENT_TOKEN, POLICY, LabController
from tests.integration.slurm.lab import SlurmLab, wait_for

pytestmark = pytest.mark.slurm

GPUFLEET = str(Path(sys.executable).with_name("gpufleet"))


@pytest.fixture
def ctl(lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path) -> Iterator[LabController]:
    c = LabController.start(tmp_path, sched, lab.nodes)
    yield c
    c.stop()


def _done(ctl: LabController, node: str, kind: str) -> dict[str, object]:
    """The action once the controller has recorded it done (Slurm may show its effect a moment earlier)."""
    wait_for(lambda: (a := ctl.action(node, kind)) is not None and a["status"] == "done", f"{kind} on {node} done")
    action = ctl.action(node, kind)
    assert action is not None
    return action


def _in_service(ctl: LabController, node: str) -> None:
    wait_for(lambda: ctl.node_state(node) == "in_service", f"controller sees a job on {node}")


def test_fatal_xid_drains_in_slurm_and_requeues_the_job(lab: SlurmLab, sched: SlurmScheduler,
                                                       ctl: LabController) -> None:
    job = lab.sbatch("n1")
    _in_service(ctl, "n1")
    ctl.post_event("n1", "xid", code=79, component="n1-gpu3", message="GPU has fallen off the bus")
    wait_for(lambda: "DRAIN" in sched.slurm_node("n1").flags, "n1 DRAIN in slurm")
    (decision,) = [d for d in ctl.decisions("n1") if d["rule"] == "fatal_event"]
    assert sched.slurm_node("n1").reason.startswith(f"gpufleet:{decision['id']} ")
    assert f"Reason=gpufleet:{decision['id']}" in lab.scontrol_show_node("n1")
    wait_for(lambda: sched.job(job).restarts == 1, "job requeued")
    wait_for(lambda: job not in [j.id for j in sched.jobs_on("n1")], "job off n1 (after COMPLETING)")
    assert sched.job(job).state == JobState.PENDING
    wait_for(lambda: all(a["status"] == "done" for a in ctl.actions("n1")), "actions done")
    assert sorted(a["kind"] for a in ctl.actions("n1")) == ["drain", "requeue_jobs"]
    assert "n2" not in [n.name for n in sched.list_nodes() if n.drained_by_us]


@pytest.mark.parametrize("carrier", ["job-comment", "controller-api"])
def test_drain_after_checkpoint_waits_for_the_checkpoint(lab: SlurmLab, sched: SlurmScheduler, ctl: LabController,
                                                        tmp_path: Path, carrier: str) -> None:
    trigger = tmp_path / "write-checkpoint-now"
    if carrier == "job-comment":
        report = f"{shlex.quote(GPUFLEET)} slurm checkpoint"
    else:
        token = tmp_path / "token"
        token.write_text(AGENT_TOKEN)
        report = (f"{shlex.quote(GPUFLEET)} slurm checkpoint --no-comment --controller {ctl.url.removesuffix('/v1')} "
                  f"--token-file {token}")
    # The job handles the checkpoint request (USR1) by carrying on: it checkpoints when the test says.
    script = f"trap true USR1; while [ ! -e {trigger} ]; do sleep 0.1; done; {report}; sleep 600"
    job = lab.sbatch("n2", script)
    _in_service(ctl, "n2")
    ctl.post_event("n2", "thermal", severity="degraded", component="n2-gpu1", message="HBM 96C")
    wait_for(lambda: (a := ctl.action("n2", "drain_after_checkpoint")) is not None and a["status"] == "waiting",
             "drain_after_checkpoint waiting for the job's checkpoint")
    assert "DRAIN" not in sched.slurm_node("n2").flags, "must not drain before the checkpoint"
    assert ctl.node_state("n2") == "suspect"
    trigger.touch()
    wait_for(lambda: "DRAIN" in sched.slurm_node("n2").flags,
             lambda: f"n2 drained after the checkpoint; job output: {lab.job_output(job)!r}")
    wait_for(lambda: sched.job(job).restarts == 1, "job requeued to restart from its checkpoint elsewhere")
    result = str(_done(ctl, "n2", "drain_after_checkpoint")["result"])
    assert result.startswith("drained after checkpoint at") and result.endswith(f"requeued {job}")
    assert sched.node("n2").reason.startswith("gpufleet:")


def test_drain_after_checkpoint_drains_when_the_job_ends(lab: SlurmLab, sched: SlurmScheduler,
                                                         ctl: LabController, tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    job = lab.sbatch("n3", f"trap true USR1; while [ ! -e {stop} ]; do sleep 0.1; done; true")
    _in_service(ctl, "n3")
    ctl.post_event("n3", "thermal", severity="degraded", component="n3-gpu0", message="HBM 96C")
    wait_for(lambda: (a := ctl.action("n3", "drain_after_checkpoint")) is not None and a["status"] == "waiting",
             "waiting for a checkpoint")
    assert "DRAIN" not in sched.slurm_node("n3").flags
    stop.touch()  # the job ends without ever checkpointing
    wait_for(lambda: "DRAIN" in sched.slurm_node("n3").flags, "drained once the job ended")
    assert lab.job_state(job) == "COMPLETED"
    assert _done(ctl, "n3", "drain_after_checkpoint")["result"] == "drained: no job running"


def test_drain_after_checkpoint_gives_up_waiting_after_the_timeout(lab: SlurmLab, sched: SlurmScheduler,
                                                                   tmp_path: Path) -> None:
    policy = POLICY.replace('checkpoint_wait_timeout = "10m"', 'checkpoint_wait_timeout = "2s"')
    ctl = LabController.start(tmp_path, sched, lab.nodes, policy_text=policy)
    try:
        job = lab.sbatch("n1", "trap true USR1; while true; do sleep 0.2; done")  # asked, never reports
        _in_service(ctl, "n1")
        ctl.post_event("n1", "thermal", severity="degraded", component="n1-gpu0", message="HBM 96C")
        wait_for(lambda: "DRAIN" in sched.slurm_node("n1").flags, "drained after the checkpoint timeout")
        result = _done(ctl, "n1", "drain_after_checkpoint")["result"]
        assert result.startswith("drained no checkpoint within 0:00:02 (") and result.endswith(f"requeued {job}")
        wait_for(lambda: sched.job(job).restarts == 1, "job requeued after the wait timed out")
    finally:
        ctl.stop()


class KillsControllerAfterDrain(SlurmScheduler):
    """The real adapter; right after its first successful drain, slurmctld is SIGKILLed (a crash)."""

    def __init__(self, lab: SlurmLab) -> None:
        super().__init__(slurm_conf=lab.slurm_conf)
        self.lab, self.killed = lab, False

    def drain(self, node: str, reason: str) -> bool:
        drained = super().drain(node, reason)
        if not self.killed:
            self.killed = True
            self.lab.script("ctld-stop")
        return drained


def test_slurmctld_killed_mid_operation_retried_never_duplicated(lab: SlurmLab, tmp_path: Path) -> None:
    job = lab.sbatch("n3")
    wait_for(lambda: lab.job_state(job) == "RUNNING", "job running")
    lab.wait_job_saved(job)  # the job's start must survive the crash below
    sched = KillsControllerAfterDrain(lab)
    ctl = LabController.start(tmp_path, sched, lab.nodes)
    try:
        _in_service(ctl, "n3")
        ctl.post_event("n3", "xid", code=48, component="n3-gpu0", message="DBE")
        # drain went through, then slurmctld died: the requeue fails, is recorded and retried
        wait_for(lambda: (a := ctl.action("n3", "requeue_jobs")) is not None and a["attempts"] >= 2,
                 "requeue retried while slurmctld is down")
        requeue = ctl.action("n3", "requeue_jobs")
        assert requeue is not None and requeue["status"] == "pending"
        assert "unreachable" in requeue["last_error"]
        assert ctl.admin.get("/status").json()["scheduler_reachable"] is False
        lab.script("ctld-start")
        wait_for(lambda: all(a["status"] == "done" for a in ctl.actions("n3")), "actions done after restart", 60)
        wait_for(lambda: "DRAIN" in sched.slurm_node("n3").flags, "n3 drained (re-asserted if the crash lost it)")
        decisions = [d for d in ctl.decisions("n3") if d["rule"] == "fatal_event"]
        assert len(decisions) == 1
        assert sorted(a["kind"] for a in ctl.actions("n3")) == ["drain", "requeue_jobs"]
        assert sched.job(job).restarts == 1, "the job was requeued exactly once"
        assert sched.node("n3").reason.startswith(f"gpufleet:{decisions[0]['id']} ")
    finally:
        ctl.stop()
        if "slurmctld up" not in lab.script("status", check=False):
            lab.script("ctld-start")


def test_a_node_an_operator_drained_in_slurm_counts_against_the_budget(lab: SlurmLab, sched: SlurmScheduler,
                                                                     tmp_path: Path) -> None:
    """A drill: an operator drained nodes with scontrol for PSU work; gpufleet, which still had them ready,
    drained more for fatal XIDs with the breaker "ok" (4 of 5 out). The budget here is 1 of 3 nodes: with
    n2 drained by hand, n1's XID 79 is held, not carried out, and the breaker names the budget."""
    policy = POLICY.replace("max_unavailable_fleet = 1.0", "max_unavailable_fleet = 0.34")
    ctl = LabController.start(tmp_path, sched, lab.nodes, policy_text=policy)
    try:
        lab.cmd("scontrol", "update", "nodename=n2", "state=drain", "reason=admin: PSU swap (ticket 4711)")
        wait_for(lambda: ctl.admin.get("/breaker").json()["out_in_scheduler"] == ["n2"],
                 "the controller counts n2 as out")
        assert ctl.node_state("n2") == "ready", "still serving in gpufleet's eyes: not its drain"
        ctl.post_event("n1", "xid", code=79, component="n1-gpu3", message="GPU has fallen off the bus")
        wait_for(lambda: any(d["status"] == "held" for d in ctl.decisions("n1")), "n1's decision held")
        breaker = ctl.admin.get("/breaker").json()
        assert breaker["tripped"] and "fleet budget: 2 of 3" in breaker["reason"], breaker
        assert "DRAIN" not in sched.slurm_node("n1").flags
        lab.cmd("scontrol", "update", "nodename=n2", "state=resume")
        wait_for(lambda: ctl.admin.get("/breaker").json()["out_in_scheduler"] == [], "n2 serves again")
    finally:
        ctl.stop()
        lab.cmd("scontrol", "update", "nodename=n2", "state=resume", check=False)


def test_a_drift_redrain_keeps_the_reason_an_operator_put_on_the_node(lab: SlurmLab, sched: SlurmScheduler,
                                                                      ctl: LabController) -> None:
    """A drill: gpufleet had n1 out for a fatal XID; an operator wrote their own reason on it (an RMA
    ticket), then resumed it. gpufleet drained it again for drift (not revalidated) with a reason of its
    own, and the operator's words were gone from Slurm (a resume clears the reason: seen on 22.05). The
    re-drain keeps them, after gpufleet's own, so revalidation still resumes it as gpufleet's."""
    ctl.post_event("n1", "xid", code=79, component="n1-gpu3", message="GPU has fallen off the bus")
    _done(ctl, "n1", "drain")
    wait_for(lambda: ctl.node_state("n1") == "drained", "n1 drained in gpufleet")
    lab.cmd("scontrol", "update", "nodename=n1", "state=drain", "reason=jdoe: RMA 4411, GPU3 swap pending")
    assert sched.slurm_node("n1").reason == "jdoe: RMA 4411, GPU3 swap pending"
    passes: list[int] = []
    ctl.runtime.reconciler.on_pass.append(lambda _s, _n: passes.append(1))
    wait_for(lambda: len(passes) >= 2, "a whole reconciler pass saw the operator's reason")
    lab.cmd("scontrol", "update", "nodename=n1", "state=resume")
    wait_for(lambda: any(a["action"] == "drift_redrain" for a in ctl.audit("n1")), "n1 drained again for drift")
    reason = sched.slurm_node("n1").reason
    assert "DRAIN" in sched.slurm_node("n1").flags
    assert reason.startswith("gpufleet:drift drained: not revalidated"), reason
    assert reason.endswith("; before: jdoe: RMA 4411, GPU3 swap pending"), reason
    assert sched.node("n1").drained_by_us  # gpufleet's own drain: revalidation resumes it
