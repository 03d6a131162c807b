"""The node lifecycle loop on the real Slurm lab: checkpoint request before a drain, validation jobs.

A real controller (SQLite, reconciler, HTTP API) drives the lab's slurmctld and slurmd. The lab has no
GPU, so the validation job's command is a small stand-in that posts the verdict a ``gpufleet check``
would post, through the same poster (``gpufleet.checks.poster``); what is under test is the Slurm
side: the reservation, the undrain, the pinned job, the verdict coming back, the way home.
"""

from __future__ import annotations

import re
import shlex
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from gpufleet.schedulers.slurm import SlurmScheduler
from gpufleet.schedulers.slurm.validation import SlurmValidator, ValidationJobs, reservation_of
from tests.integration.slurm.controller import AGENT_TOKEN, POLICY, LabController
from tests.integration.slurm.lab import SlurmLab, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.loop]

GPUFLEET = str(Path(sys.executable).with_name("gpufleet"))
# Why Slurm 22.05 keeps a job in a down partition, pinned to a drained node in a reservation, pending.
PENDING_REASONS = ("PartitionDown", "ReqNodeNotAvail", "Resources", "Reservation")


def _action(ctl: LabController, node: str, kind: str, status: str) -> dict[str, object]:
    wait_for(lambda: (a := ctl.action(node, kind)) is not None and a["status"] == status,
             lambda: f"{kind} on {node} {status}: {ctl.action(node, kind)}")
    a = ctl.action(node, kind)
    assert a is not None
    return a


def test_degraded_node_job_is_asked_to_checkpoint_then_drained_and_requeued(
        lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path) -> None:
    got = lab.root / "jobs" / "loop-got-signal"
    # The training-script contract: on the signal, save, then report the checkpoint (here: the
    # job-comment carrier, which needs no controller credentials).
    script = (f"trap 'touch {got}; {shlex.quote(GPUFLEET)} slurm checkpoint' USR1; "
              "while true; do sleep 0.2; done")
    ctl = LabController.start(tmp_path, sched, lab.nodes)
    try:
        job = lab.sbatch("n2", script, "--comment", "llama run 3 gpufleet:signal=USR1")  # opts in
        wait_for(lambda: ctl.node_state("n2") == "in_service", "controller sees the job on n2")
        ctl.post_event("n2", "thermal", severity="degraded", component="n2-gpu1", message="HBM 96C")
        wait_for(got.exists, lambda: f"the job received USR1; output {lab.job_output(job)!r}")
        a = _action(ctl, "n2", "drain_after_checkpoint", "done")
        assert str(a["result"]).startswith("drained after checkpoint at"), a
        assert str(a["result"]).endswith(f"requeued {job}")
        progress = a["progress"]
        assert isinstance(progress, dict) and progress["jobs"] == job and progress["signal"] == "USR1"
        assert float(progress["budget_gpu_hours"]) == 64.0
        assert "DRAIN" in sched.slurm_node("n2").flags
        wait_for(lambda: sched.job(job).restarts == 1, "job requeued from the checkpoint it wrote")
        asked = [x for x in ctl.audit("n2") if x["action"] == "checkpoint_request"]  # before the signal
        assert len(asked) == 1 and f"asking job(s) {job} to checkpoint" in asked[0]["detail"]
        (signal,) = [x for x in ctl.audit("n2") if x["action"] == "checkpoint_signal"]  # what was sent
        assert f"asked job {job} to checkpoint (SIGUSR1)" in signal["detail"]
    finally:
        ctl.stop()


def test_a_job_that_never_checkpoints_is_drained_at_the_deadline(
        lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path) -> None:
    got = lab.root / "jobs" / "loop-ignored-signal"
    policy = POLICY.replace('auto_repair = false\n',
                            'auto_repair = false\ncheckpoint_risk_budget = 0.001\ncheckpoint_grace = "2s"\n')
    ctl = LabController.start(tmp_path, sched, lab.nodes, policy_text=policy)
    try:
        job = lab.sbatch("n3", f"trap 'touch {got}' USR1; while true; do sleep 0.2; done",  # never reports
                         "--comment", "gpufleet:signal=USR1")
        wait_for(lambda: ctl.node_state("n3") == "in_service", "controller sees the job on n3")
        ctl.post_event("n3", "thermal", severity="degraded", component="n3-gpu0", message="HBM 96C")
        wait_for(got.exists, "the job received USR1")
        a = _action(ctl, "n3", "drain_after_checkpoint", "done")
        assert "GPU-hours at risk, budget 0.001" in str(a["result"]) and str(a["result"]).endswith(f"requeued {job}")
        assert "DRAIN" in sched.slurm_node("n3").flags
        wait_for(lambda: sched.job(job).restarts == 1, "job requeued at the deadline")
    finally:
        ctl.stop()


def test_a_job_that_did_not_opt_in_is_not_signalled_and_survives_until_the_deadline_drain(
        lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path) -> None:
    """No ``gpufleet:signal=`` in its comment: USR1 would kill this job (a batch shell that does not
    trap it dies of it), so it is not signalled; it runs on until the deadline drains the node and
    requeues it (a job killed by a signal would not be requeued: restarts would stay 0)."""
    policy = POLICY.replace('auto_repair = false\n',
                            'auto_repair = false\ncheckpoint_risk_budget = 0.001\ncheckpoint_grace = "3s"\n')
    ctl = LabController.start(tmp_path, sched, lab.nodes, policy_text=policy)
    try:
        job = lab.sbatch("n1", "while true; do sleep 0.2; done", "--comment", "no opt-in here")
        wait_for(lambda: ctl.node_state("n1") == "in_service", "controller sees the job on n1")
        ctl.post_event("n1", "thermal", severity="degraded", component="n1-gpu0", message="HBM 96C")
        a = _action(ctl, "n1", "drain_after_checkpoint", "done")
        assert isinstance(a["progress"], dict) and a["progress"]["signal"] == "", a
        assert str(a["result"]).endswith(f"requeued {job}"), a
        wait_for(lambda: sched.job(job).restarts == 1, "the job survived and was requeued at the deadline")
        asked = [x for x in ctl.audit("n1") if x["action"] == "checkpoint_request"]
        (signal,) = [x for x in ctl.audit("n1") if x["action"] == "checkpoint_signal"]
        assert len(asked) == 1 and "declared no checkpoint signal: not asked" in signal["detail"]
    finally:
        ctl.stop()


def _verdict_script(tmp_path: Path, agent_token: str = AGENT_TOKEN) -> tuple[Path, Path]:
    """A stand-in for ``gpufleet check --controller ...`` on a GPU-less lab: posts the verdict named in
    ``verdict`` through the check poster (retrying, like ``gpufleet check``). The controller's URL is
    known only once its API listens, so the script reads it from a file the test writes then (and
    waits for it); it also waits for the verdict file, so a test can keep the job running (up to
    120 s) until it writes one."""
    token = tmp_path / "check-token"
    token.write_text(agent_token)
    url_file = tmp_path / "controller-url"
    script = tmp_path / "validate.py"
    script.write_text(
        "import os, sys, time, uuid\nfrom datetime import UTC, datetime\nfrom pathlib import Path\n"
        "from gpufleet.checks.poster import post_events, read_token\n"
        "from gpufleet.domain.events import EventKind, HealthEvent\n"
        "node, level, url_file, tok, verdict = sys.argv[1:6]\n"
        "deadline = time.monotonic() + 120\n"
        "while not (Path(url_file).exists() and Path(verdict).exists()) and time.monotonic() < deadline:\n"
        "    time.sleep(0.1)\n"
        "kind = EventKind.CHECK_PASSED if Path(verdict).read_text().strip() == 'pass' else EventKind.CHECK_FAILED\n"
        "job = os.environ.get('SLURM_JOB_ID', '?')\n"
        "e = HealthEvent(f'check-{uuid.uuid4().hex[:8]}', node, kind, datetime.now(UTC), source='check',\n"
        "                message=f'{level} check in job {job}', attrs={'check': 'gemm_bf16', 'level': level})\n"
        "post_events(Path(url_file).read_text().strip(), read_token(Path(tok)), [e], retry_for_s=120)\n")
    verdict = tmp_path / "verdict"
    command = f"{shlex.quote(sys.executable)} {script} {{node}} {{level}} {url_file} {token} {verdict}"
    (tmp_path / "command").write_text(command)
    return url_file, verdict


def _reserved(lab: SlurmLab, node: str) -> bool:
    return lab.cmd("scontrol", "show", "reservation", reservation_of(node), check=False).returncode == 0


def _history(ctl: LabController, node: str) -> list[tuple[str, str]]:
    return [(t["from_state"], t["to_state"]) for t in ctl.admin.get(f"/nodes/{node}").json()["history"]][::-1]


@pytest.mark.parametrize("verdict", ["pass", "fail"])
def test_a_new_node_is_burned_in_by_a_slurm_job_before_it_takes_work(
        lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path, verdict: str) -> None:
    url_file, verdict_file = _verdict_script(tmp_path)
    verdict_file.write_text(verdict)
    jobs = ValidationJobs((tmp_path / "command").read_text(), "root", time_limit=timedelta(minutes=5),
                          output=str(lab.root / "jobs" / "validate-%j.out"))
    validator = SlurmValidator(sched, jobs, slurm_conf=lab.slurm_conf)
    policy = POLICY.replace("auto_repair = false\n", "auto_repair = false\nauto_burn_in = true\n")
    ctl = LabController.start(tmp_path, sched, ["n2", "n3"], policy_text=policy, validator=validator,
                              new_nodes=["n1"])
    url_file.write_text(ctl.url.removesuffix("/v1"))
    try:
        a = _action(ctl, "n1", "validate", "done")
        progress = a["progress"]
        assert isinstance(progress, dict) and progress["level"] == "burnin"
        job_id = progress["validation"]
        assert sched.job(job_id).nodes == ("n1",)
        if verdict == "pass":
            wait_for(lambda: ctl.node_state("n1") == "ready", "n1 ready after burn-in")
            assert ("new", "burn_in") in _history(ctl, "n1") and ("burn_in", "ready") in _history(ctl, "n1")
            _action(ctl, "n1", "resume", "done")
            assert not _reserved(lab, "n1"), "the reservation is gone once n1 is in service"
            assert "DRAIN" not in sched.slurm_node("n1").flags
            work = lab.sbatch("n1", "echo ran-on-$SLURMD_NODENAME")
            wait_for(lambda: lab.job_state(work) == "COMPLETED", "n1 takes work after burn-in")
        else:
            wait_for(lambda: ctl.node_state("n1") == "repair", "n1 back to repair")
            _action(ctl, "n1", "drain", "done")  # the failed validation's drain (burn-in's own came first)
            wait_for(lambda: "DRAIN" in sched.slurm_node("n1").flags, "n1 drained again after the failed burn-in")
            assert not _reserved(lab, "n1"), "reservation deleted after the drain"
        assert [x["action"] for x in ctl.audit("n1")].count("validation_job") == 1
    finally:
        ctl.stop()
        lab.cmd("scontrol", "delete", f"reservationname={reservation_of('n1')}", check=False)


def _never_starting(lab: SlurmLab, tmp_path: Path, policy: str) -> tuple[ValidationJobs, str]:
    """Validation jobs that cannot start (their partition, ``high``, set DOWN here: the test sets it UP
    again), and ``policy`` with a ``validation_start_timeout`` of 3 s."""
    jobs = ValidationJobs((tmp_path / "command").read_text(), "root", partition="high",
                          time_limit=timedelta(minutes=5), output=str(lab.root / "jobs" / "validate-%j.out"))
    lab.cmd("scontrol", "update", "PartitionName=high", "State=DOWN")
    return jobs, policy.replace("[policy]\n", '[policy]\nvalidation_start_timeout = "3s"\n')


def test_a_validation_job_that_never_starts_is_cancelled_and_the_node_goes_back_to_repair(
        lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path) -> None:
    """The drill: a node is revalidated, its validation job cannot start (here its partition is down) and
    an operator drains the node by hand meanwhile. Until 2026-11-28 the job pending was read as running
    and the node sat in revalidate for ever; now the job is cancelled at validation_start_timeout and the
    validation fails, naming Slurm's pending reason."""
    url_file, verdict_file = _verdict_script(tmp_path)
    verdict_file.write_text("pass")
    jobs, policy = _never_starting(lab, tmp_path, POLICY)
    ctl = LabController.start(tmp_path, sched, lab.nodes, policy_text=policy,
                              validator=SlurmValidator(sched, jobs, slurm_conf=lab.slurm_conf))
    url_file.write_text(ctl.url.removesuffix("/v1"))
    try:
        ctl.post_event("n1", "xid", code=79, component="n1-gpu0")
        wait_for(lambda: ctl.node_state("n1") == "drained", lambda: f"n1 drained: {ctl.node_state('n1')}")
        ctl.admin.post("/nodes/n1/resume", json={"reason": "drill: revalidate"}).raise_for_status()
        wait_for(lambda: (a := ctl.action("n1", "validate")) is not None and "validation" in (a["progress"] or {}),
                 lambda: f"validation job submitted: {ctl.action('n1', 'validate')}")
        job = str(ctl.action("n1", "validate")["progress"]["validation"])  # type: ignore[index]
        assert lab.job_state(job) == "PENDING"
        lab.cmd("scontrol", "update", "nodename=n1", "state=drain", "reason=operator: PSU swap")
        wait_for(lambda: ctl.node_state("n1") == "repair", lambda: f"n1 back to repair: {ctl.node_state('n1')}")
        assert lab.job_state(job) == "CANCELLED", "the job that never started is cancelled in Slurm"
        a = _action(ctl, "n1", "validate", "done")
        said = re.search(rf"validation job {job} never started: pending \((\w+)\)", str(a["result"]))
        assert said and said[1] in PENDING_REASONS, a["result"]  # Slurm's words (it changes them while it waits)
        (cancelled,) = [x for x in ctl.audit("n1") if x["action"] == "validation_cancelled"]
        assert said[0] in cancelled["detail"] and "(validation_start_timeout 0:00:03)" in cancelled["detail"]
        _action(ctl, "n1", "drain", "done")
        node = sched.slurm_node("n1")
        assert "DRAIN" in node.flags and node.reason == "operator: PSU swap", "the operator's drain is kept"
        assert not _reserved(lab, "n1"), "the reservation is gone"
    finally:
        ctl.stop()
        lab.cmd("scontrol", "update", "PartitionName=high", "State=UP")
        lab.cmd("scontrol", "delete", f"reservationname={reservation_of('n1')}", check=False)
