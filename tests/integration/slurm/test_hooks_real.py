"""The gpufleet Slurm hooks run by real slurmd daemons (Prolog, Epilog, HealthCheckProgram)."""

from __future__ import annotations

import json
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpufleet.agent.nodestatus import write_status
from gpufleet.domain.nodestatus import NodeStatus
from gpufleet.schedulers.port import JobState
from gpufleet.schedulers.slurm import SlurmScheduler
from tests.integration.slurm.lab import SlurmLab, wait_for

pytestmark = pytest.mark.slurm

GPUFLEET = str(Path(sys.executable).with_name("gpufleet"))


def _hook_cmd(*args: str) -> str:
    return "#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in (GPUFLEET, "slurm", *args)) + "\n"


def test_prolog_refuses_node_whose_quick_check_fails(lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path) -> None:
    check = tmp_path / "failing-check.sh"
    check.write_text("#!/bin/sh\necho 'gemm gpu2: 310 TFLOP/s, expected >= 600' >&2\nexit 1\n")
    check.chmod(0o755)
    lab.hook("prolog", _hook_cmd("prolog", "--check-command", str(check)), node="n3")
    job = lab.sbatch("n3", "sleep 1")
    wait_for(lambda: "DRAIN" in sched.slurm_node("n3").flags, "n3 drained by the prolog")
    node = sched.node("n3")
    assert node.drained_by_us
    assert node.reason == f"gpufleet:prolog-{job} quick check failed: gemm gpu2: 310 TFLOP/s, expected >= 600"
    # Slurm requeued the job (not held: SchedulerParameters=nohold_on_prolog_fail) and never ran it on n3.
    wait_for(lambda: (j := sched.job(job)).restarts >= 1 and j.state == JobState.PENDING,
             "job requeued (pending) after the prolog failure")
    assert dict(sched.job(job).extra)["state_reason"] != "launch_failed_requeued_held"
    assert not (lab.root / "jobs" / f"{job}.out").exists() or "n3" not in (lab.root / "jobs" / f"{job}.out").read_text()


def test_prolog_lets_healthy_node_run(lab: SlurmLab, sched: SlurmScheduler) -> None:
    lab.hook("prolog", _hook_cmd("prolog", "--check-command", "true"), node="n1")
    job = lab.sbatch("n1", "echo ran-on-$SLURMD_NODENAME")
    wait_for(lambda: lab.job_state(job) == "COMPLETED", "job completed")
    assert (lab.root / "jobs" / f"{job}.out").read_text().strip() == "ran-on-n1"
    assert "DRAIN" not in sched.slurm_node("n1").flags


def test_healthcheck_drains_on_fatal_agent_status(lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path) -> None:
    status = tmp_path / "n2-status.json"
    write_status(status, NodeStatus("n2", datetime.now(UTC), "ok"))
    lab.hook("healthcheck", _hook_cmd("healthcheck", "--status-file", str(status)), node="n2")
    write_status(status, NodeStatus("n2", datetime.now(UTC), "fatal", ("xid 79 on gpu5: fell off the bus",),
                                    decision="d-hc1"))
    wait_for(lambda: "DRAIN" in sched.slurm_node("n2").flags, "HealthCheckProgram drained n2", timeout=60)
    assert sched.node("n2").reason == "gpufleet:d-hc1 xid 79 on gpu5: fell off the bus"
    assert "DRAIN" not in sched.slurm_node("n1").flags  # only its own node


def test_epilog_records_job_end(lab: SlurmLab, tmp_path: Path) -> None:
    journal = tmp_path / "jobs.jsonl"
    lab.hook("epilog", _hook_cmd("epilog", "--journal", str(journal)), node="n2")
    job = lab.sbatch("n2", "exit 3")
    wait_for(lambda: journal.exists() and job in journal.read_text(), "epilog journal line")
    rec = json.loads(journal.read_text().splitlines()[-1])
    assert rec["job_id"] == job and rec["node"] == "n2" and rec["format"] == "gpufleet.slurm-job/v1"


def test_checkpoint_hook_inside_job_reaches_adapter(lab: SlurmLab, sched: SlurmScheduler) -> None:
    cmd = f"{shlex.quote(GPUFLEET)} slurm checkpoint --at 2026-11-21T13:14:15Z; sleep 600"
    job = lab.sbatch("n1", cmd, "--comment", "llama run 3")
    wait_for(lambda: sched.job(job).last_checkpoint is not None, "checkpoint visible through squeue --json")
    j = sched.job(job)
    assert j.last_checkpoint == datetime(2026, 11, 21, 13, 14, 15, tzinfo=UTC)
    assert dict(j.extra)["comment"] == "llama run 3 gpufleet:checkpoint=2026-11-21T13:14:15Z"


def test_healthcheck_drains_from_the_status_file_a_real_agent_writes_with_no_controller(
        lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path) -> None:
    """The controller is not running at all: the agent (simulated GPUs, not pushing) writes its status
    file, slurmd's HealthCheckProgram reads it and drains the node by itself."""
    import signal
    import subprocess

    state = tmp_path / "agent-state"
    conf = tmp_path / "agent.toml"
    conf.write_text("status_interval_s = 0.5\n")
    status = state / "node-status.json"
    lab.hook("healthcheck", _hook_cmd("healthcheck", "--status-file", str(status), "--max-age", "1m"), node="n3")
    log = tmp_path / "agent.log"
    agent = subprocess.Popen([GPUFLEET, "agent", "--device", "sim", "--gpus", "2", "--node", "n3", "--no-push",
                              "--state-dir", str(state), "--no-kmsg", "--metrics-port", "0", "--metrics-addr",
                              "127.0.0.1", "--config", str(conf), "--inject", "gpu_lost@gpu1@+3"],
                             stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: status.exists() and '"worst": "ok"' in status.read_text(), "the agent writes an ok status")
        assert "DRAIN" not in sched.slurm_node("n3").flags
        wait_for(lambda: "DRAIN" in sched.slurm_node("n3").flags,
                 lambda: f"HealthCheckProgram drained n3; status {status.read_text()}; log {log.read_text()[-800:]}",
                 timeout=60)
        reason = sched.node("n3").reason
        assert reason.startswith("gpufleet:healthcheck xid 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS) on n3-gpu1")
        assert "DRAIN" not in sched.slurm_node("n2").flags
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=20)


def test_healthcheck_leaves_a_fatal_status_to_a_reachable_controller_and_drains_once_it_is_out_of_reach(
        lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path) -> None:
    """A drill: the hook drained nodes the controller held for its budget, and a node under its own
    validation job. While the agent's status says it reached the controller lately, slurmd's
    HealthCheckProgram leaves the fatal verdict to the controller; once the controller has been out of
    reach for longer than --controller-fresh, the hook drains by itself."""
    from datetime import timedelta

    status, log = tmp_path / "n2-status.json", tmp_path / "hook.log"
    reasons = ("xid 79 on gpu5: fell off the bus",)
    now = datetime.now(UTC)
    write_status(status, NodeStatus("n2", now, "fatal", reasons, controller_reached=now))
    cmd = " ".join(shlex.quote(a) for a in (GPUFLEET, "slurm", "healthcheck", "--status-file", str(status),
                                            "--controller-fresh", "2m"))
    lab.hook("healthcheck", f"#!/bin/sh\n{cmd} 2>>{shlex.quote(str(log))}\n", node="n2")
    wait_for(lambda: log.exists() and "left to the controller" in log.read_text(), "the hook ran and deferred",
             timeout=60)
    assert "DRAIN" not in sched.slurm_node("n2").flags
    later = datetime.now(UTC)
    write_status(status, NodeStatus("n2", later, "fatal", reasons, controller_reached=later - timedelta(minutes=5)))
    wait_for(lambda: "DRAIN" in sched.slurm_node("n2").flags, "out of reach: the hook drained n2", timeout=60)
    assert sched.node("n2").reason == "gpufleet:healthcheck xid 79 on gpu5: fell off the bus"


def test_healthcheck_says_drained_once_and_stays_quiet_on_a_node_already_drained(
        lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path) -> None:
    """A drill: slurmd ran the hook every HealthCheckInterval (5 s on the lab) and every run said
    "drained n2" and exited 1 for a node drained long before (slurmd logs a health check's non-zero exit
    with its output). Now the run that drains says so and exits 1; the runs after it, on the node already
    drained, say nothing and exit 0."""
    status, log = tmp_path / "n2-status.json", tmp_path / "hook.log"
    write_status(status, NodeStatus("n2", datetime.now(UTC), "fatal", ("xid 79 on gpu5: fell off the bus",)))
    cmd = " ".join(shlex.quote(a) for a in (GPUFLEET, "slurm", "healthcheck", "--status-file", str(status)))
    to_log = shlex.quote(str(log))
    lab.hook("healthcheck", f"#!/bin/sh\n{cmd} 2>>{to_log}\necho \"exit $?\" >>{to_log}\n", node="n2")
    wait_for(lambda: "DRAIN" in sched.slurm_node("n2").flags, "the hook drained n2", timeout=60)
    wait_for(lambda: log.exists() and log.read_text().count("exit ") >= 3,
             lambda: f"two more runs: {log.read_text()}", timeout=60)
    runs = log.read_text().split("exit ")
    assert runs[0].strip() == "gpufleet healthcheck: drained n2: gpufleet:healthcheck xid 79 on gpu5: fell off the bus"
    assert runs[1].strip() == "1", log.read_text()  # the run that drained exited 1; the next one said nothing
    assert all(r.strip() == "0" for r in runs[2:]), f"runs on the drained node said something: {log.read_text()}"
    assert sched.node("n2").reason == "gpufleet:healthcheck xid 79 on gpu5: fell off the bus"
