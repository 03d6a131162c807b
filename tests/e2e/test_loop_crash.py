"""Crash safety of the lifecycle loop on the real Slurm lab (issue #13): a real ``gpufleet controller
serve`` process is killed with SIGKILL in each phase of the loop and started again on the same
database; the loop resumes and nothing runs twice.

* signal sent: the job is asked to checkpoint once, not again by the restarted controller; its
  checkpoint (reported after the restart) drains the node and requeues the job once;
* waiting for the checkpoint: the restarted controller keeps the same deadline and drains + requeues
  once, at that deadline;
* validation job running in the maintenance reservation: no second validation job is submitted for
  the same action; killed again while the check posts its verdict, the check retries until the
  restarted controller takes it, and the verdict returns the node to service;
* validation job still queued (its partition down): the same queued job is followed, then returns the node;
* a fabric fault's pairing job running: the same partner and the same job after the restart.

(The repair-executor phase: tests/integration/crash/test_repair_crash.py.)
"""

from __future__ import annotations

import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpufleet.schedulers.slurm.validation import COMMENT_PREFIX, reservation_of
from tests.e2e.harness import AGENT_TOKEN, BASE_POLICY, Controller, Fleet, wait_until
from tests.integration.slurm.lab import SlurmLab
from tests.integration.slurm.test_loop import _verdict_script
from tests.integration.slurm.test_pairing_loop import PairLab

pytestmark = [pytest.mark.e2e, pytest.mark.slurm, pytest.mark.loop]

GPUFLEET = str(Path(sys.executable).with_name("gpufleet"))


def _action(ctl: Controller, node: str, kind: str) -> dict[str, Any] | None:
    return next((a for a in ctl.api.actions(node) if a["kind"] == kind), None)


def _waiting(ctl: Controller, node: str, kind: str, key: str) -> dict[str, Any]:
    """The ``kind`` action on ``node`` once it is waiting with ``key`` in its progress."""
    def seen() -> dict[str, Any] | None:
        a = _action(ctl, node, kind)
        return a if a is not None and a["status"] == "waiting" and (a["progress"] or {}).get(key) else None
    got: dict[str, Any] = wait_until(seen, lambda: f"{kind} on {node} waiting: {_action(ctl, node, kind)}", 60)
    return got


def _done(ctl: Controller, node: str, kind: str, timeout: float = 90) -> dict[str, Any]:
    def seen() -> dict[str, Any] | None:
        a = _action(ctl, node, kind)
        return a if a is not None and a["status"] == "done" else None
    got: dict[str, Any] = wait_until(seen, lambda: f"{kind} on {node} done: {_action(ctl, node, kind)}", timeout)
    return got


def _audits(ctl: Controller, node: str, action: str) -> list[dict[str, Any]]:
    return [a for a in ctl.api.get("/audit", target=node, limit=1000) if a["action"] == action]


def _restarts(lab: SlurmLab, job: str) -> int:
    out = lab.cmd("scontrol", "show", "job", job).stdout
    return next(int(t.split("=", 1)[1]) for t in out.split() if t.startswith("Restarts="))


def _drained(lab: SlurmLab, node: str) -> bool:
    return "DRAIN" in lab.scontrol_show_node(node)


def _checkpointing_job(lab: SlurmLab, node: str, work: Path) -> tuple[str, Path, Path]:
    """A job on ``node`` that opted in to the checkpoint signal. Its trap appends one line per signal
    it receives to ``signals``; it reports a checkpoint (``gpufleet slurm checkpoint``, the job-comment
    carrier) once ``go`` exists — the test decides when its checkpoint is done."""
    signals, go, done = work / "signals", work / "go", work / "reported"
    script = (f"trap 'echo USR1 >> {signals}' USR1; "
              f"while true; do if [ -e {go} ] && [ ! -e {done} ]; then touch {done}; "
              f"{shlex.quote(GPUFLEET)} slurm checkpoint; fi; sleep 0.2; done")
    job = lab.sbatch(node, script, "--comment", "pretrain gpufleet:signal=USR1")
    return job, signals, go


def _signals(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_sigkill_right_after_the_checkpoint_signal_asks_the_job_once(
        fleet: Fleet, slurm_lab: SlurmLab, tmp_path: Path) -> None:
    lab = slurm_lab
    ctl = fleet.controller(nodes=lab.nodes, scheduler="slurm", slurm_conf=lab.slurm_conf)
    job, signals, go = _checkpointing_job(lab, "n2", tmp_path)
    wait_until(lambda: ctl.api.node_state("n2") == "in_service", "the controller sees the job on n2", 30)
    ctl.api.post("/events", {"events": [{"id": "thermal-1", "node": "n2", "kind": "thermal", "severity": "degraded",
                                         "component": "n2-gpu1", "time": datetime.now(UTC).isoformat()}]})
    wait_until(lambda: _signals(signals) >= 1, "the job received USR1", 30)
    before = _waiting(ctl, "n2", "drain_after_checkpoint", "checkpoint_requested")["progress"]

    fleet.kill_controller()  # the signal is out; the job has not reported a checkpoint yet
    fleet.restart_controller()
    after = _waiting(ctl, "n2", "drain_after_checkpoint", "checkpoint_requested")["progress"]
    assert after["checkpoint_requested"] == before["checkpoint_requested"]
    assert after["deadline"] == before["deadline"], "the restarted controller keeps the same wait"
    assert not _drained(lab, "n2"), "still waiting for the checkpoint, not drained"

    go.touch()  # the job's checkpoint is written: it reports it
    a = _done(ctl, "n2", "drain_after_checkpoint")
    assert str(a["result"]).startswith("drained after checkpoint at"), a
    assert str(a["result"]).endswith(f"requeued {job}"), a
    assert _drained(lab, "n2")
    wait_until(lambda: _restarts(lab, job) >= 1, "the job requeued", 30)
    assert _restarts(lab, job) == 1, "requeued once"
    assert _signals(signals) == 1, f"signalled {_signals(signals)} times"
    assert len(_audits(ctl, "n2", "checkpoint_request")) == 1


def test_sigkill_while_waiting_for_the_checkpoint_keeps_the_deadline_and_drains_once(
        fleet: Fleet, slurm_lab: SlurmLab, tmp_path: Path) -> None:
    lab = slurm_lab
    policy = BASE_POLICY.replace("auto_repair = false\n", 'auto_repair = false\ncheckpoint_risk_budget = 0.001\n'
                                                          'checkpoint_grace = "25s"\n')
    ctl = fleet.controller(nodes=lab.nodes, scheduler="slurm", slurm_conf=lab.slurm_conf, policy=policy)
    job, signals, _go = _checkpointing_job(lab, "n3", tmp_path)  # never reports a checkpoint
    wait_until(lambda: ctl.api.node_state("n3") == "in_service", "the controller sees the job on n3", 30)
    ctl.api.post("/events", {"events": [{"id": "thermal-2", "node": "n3", "kind": "thermal", "severity": "degraded",
                                         "component": "n3-gpu0", "time": datetime.now(UTC).isoformat()}]})
    wait_until(lambda: _signals(signals) >= 1, "the job received USR1", 30)
    before = _waiting(ctl, "n3", "drain_after_checkpoint", "deadline")["progress"]
    deadline = datetime.fromisoformat(before["deadline"])

    fleet.kill_controller()
    fleet.restart_controller()
    after = _waiting(ctl, "n3", "drain_after_checkpoint", "deadline")["progress"]
    resumed = datetime.now(UTC)
    assert after["deadline"] == before["deadline"] and after["checkpoint_requested"] == before["checkpoint_requested"]
    if resumed < deadline:  # (a restart slower than the 25 s grace would only skip this look)
        assert not _drained(lab, "n3"), "drained before the deadline"

    a = _done(ctl, "n3", "drain_after_checkpoint")
    assert "no checkpoint within" in str(a["result"]) and str(a["result"]).endswith(f"requeued {job}"), a
    assert datetime.fromisoformat(a["updated"]) >= deadline, (a["updated"], deadline)
    assert _drained(lab, "n3")
    wait_until(lambda: _restarts(lab, job) >= 1, "the job requeued", 30)
    assert _restarts(lab, job) == 1, "requeued once"
    assert _signals(signals) == 1, f"signalled {_signals(signals)} times"
    assert len(_audits(ctl, "n3", "checkpoint_request")) == 1


def _validation_jobs(lab: SlurmLab, action_id: str) -> list[str]:
    """Every job Slurm knows (running or ended within MinJobAge) submitted for ``action_id``."""
    out = lab.cmd("squeue", "--states=all", "-h", "-o", "%i|%k").stdout
    return [line.split("|", 1)[0] for line in out.splitlines()
            if line.split("|", 1)[-1].strip() == f"{COMMENT_PREFIX}{action_id}"]


def test_sigkill_with_a_validation_job_running_submits_no_second_job(
        fleet: Fleet, slurm_lab: SlurmLab, tmp_path: Path) -> None:
    lab = slurm_lab
    url_file, verdict = _verdict_script(tmp_path, AGENT_TOKEN)
    command = (tmp_path / "command").read_text()
    validation = (f"[validation]\ncommand = {command!r}\nuser = \"root\"\ntime_limit = \"5m\"\n"
                  f"output = \"{lab.root / 'jobs' / 'validate-%j.out'}\"")
    ctl = fleet.controller(nodes=lab.nodes, scheduler="slurm", slurm_conf=lab.slurm_conf, extra_config=validation)
    url_file.write_text(ctl.url)
    ctl.api.post("/events", {"events": [{"id": "xid79", "node": "n1", "kind": "xid", "code": 79,
                                         "component": "n1-gpu0", "time": datetime.now(UTC).isoformat()}]})
    wait_until(lambda: ctl.api.node_state("n1") == "drained", lambda: f"n1 drained: {ctl.api.node_state('n1')}", 30)
    ctl.api.post("/nodes/n1/resume", {"reason": "crash test: revalidate"})
    a = _waiting(ctl, "n1", "validate", "validation")
    job = a["progress"]["validation"]
    wait_until(lambda: lab.job_state(job) == "RUNNING", lambda: f"validation job {job} running: {lab.job_state(job)}",
               30)
    assert _validation_jobs(lab, a["id"]) == [job]

    fleet.kill_controller()  # the validation job runs on in its reservation, its verdict not posted yet
    fleet.restart_controller()
    again = _waiting(ctl, "n1", "validate", "validation")
    assert again["progress"]["validation"] == job, "the restarted controller follows the same job"
    # a few reconciler passes later, still one job for this validation
    wait_until(lambda: _action(ctl, "n1", "validate") != again, "another pass over the validate action", 30)
    assert _validation_jobs(lab, a["id"]) == [job]

    fleet.kill_controller()  # again, and now the check finishes while no controller listens
    verdict.write_text("pass")
    out = lab.root / "jobs" / f"validate-{job}.out"
    wait_until(lambda: out.exists() and "retrying" in out.read_text(), "the check retrying its post", 30)
    fleet.restart_controller()
    wait_until(lambda: ctl.api.node_state("n1") == "ready", lambda: f"n1 ready: {ctl.api.node_state('n1')}", 60)
    _done(ctl, "n1", "resume")
    assert lab.cmd("scontrol", "show", "reservation", reservation_of("n1"), check=False).returncode != 0, \
        "the reservation is gone"
    assert not _drained(lab, "n1")
    assert _validation_jobs(lab, a["id"]) == [job], "one validation job, ever"
    assert len(_audits(ctl, "n1", "validation_job")) == 1


def test_sigkill_with_the_validation_job_still_queued_submits_no_second_job(
        fleet: Fleet, slurm_lab: SlurmLab, tmp_path: Path) -> None:
    """The validation job pends (its partition is down: Slurm queues it, allocates nothing) when the
    controller dies; after the restart the same queued job is followed and, once it runs, returns the node."""
    lab = slurm_lab
    url_file, verdict = _verdict_script(tmp_path, AGENT_TOKEN)
    verdict.write_text("pass")
    command = (tmp_path / "command").read_text()
    validation = (f"[validation]\ncommand = {command!r}\nuser = \"root\"\npartition = \"high\"\n"
                  f"time_limit = \"5m\"\noutput = \"{lab.root / 'jobs' / 'validate-%j.out'}\"")
    lab.cmd("scontrol", "update", "PartitionName=high", "State=DOWN")
    try:
        ctl = fleet.controller(nodes=lab.nodes, scheduler="slurm", slurm_conf=lab.slurm_conf,
                               extra_config=validation)
        url_file.write_text(ctl.url)
        ctl.api.post("/events", {"events": [{"id": "xid79q", "node": "n1", "kind": "xid", "code": 79,
                                             "component": "n1-gpu0", "time": datetime.now(UTC).isoformat()}]})
        wait_until(lambda: ctl.api.node_state("n1") == "drained", lambda: f"n1 drained: {ctl.api.node_state('n1')}",
                   30)
        ctl.api.post("/nodes/n1/resume", {"reason": "crash test: revalidate while the partition is down"})
        a = _waiting(ctl, "n1", "validate", "validation")
        job = a["progress"]["validation"]
        wait_until(lambda: lab.job_state(job) == "PENDING", lambda: f"job {job} pending: {lab.job_state(job)}", 30)

        fleet.kill_controller()
        fleet.restart_controller()
        again = _waiting(ctl, "n1", "validate", "validation")
        assert again["progress"]["validation"] == job, "the restarted controller follows the same queued job"
        wait_until(lambda: _action(ctl, "n1", "validate") != again, "another pass over the validate action", 30)
        assert lab.job_state(job) == "PENDING" and _validation_jobs(lab, a["id"]) == [job]
    finally:
        lab.cmd("scontrol", "update", "PartitionName=high", "State=UP")
    wait_until(lambda: ctl.api.node_state("n1") == "ready", lambda: f"n1 ready: {ctl.api.node_state('n1')}", 90)
    assert _validation_jobs(lab, a["id"]) == [job], "one validation job, ever"
    assert len(_audits(ctl, "n1", "validation_job")) == 1


def test_sigkill_with_a_pairing_job_running_keeps_its_partner_and_submits_no_second_job(
        fleet: Fleet, slurm_lab: SlurmLab, tmp_path: Path) -> None:
    """A fabric fault's validation (decision 0015): the partner is recorded before the reservation;
    after a SIGKILL the same partner and the same job are followed, and the pass returns the node."""
    lab = slurm_lab
    pl = PairLab(lab, tmp_path, partners=1, token=AGENT_TOKEN)
    pl.gate.unlink()  # hold the check until the controller has been killed and restarted
    policy = BASE_POLICY.replace("auto_repair = false\n", 'auto_repair = true\nheartbeat_timeout = "0s"\n')
    ctl = fleet.controller(nodes=lab.nodes, scheduler="slurm", slurm_conf=lab.slurm_conf, policy=policy,
                           extra_config=pl.config())
    pl.url_file.write_text(ctl.url)
    ctl.api.post("/events", {"events": [{"id": "ib-down", "node": "n1", "kind": "link_down", "link": "n1-mlx5_0/1",
                                         "component": "n1-mlx5_0", "attrs": {"rule": "ib_down"},
                                         "time": datetime.now(UTC).isoformat()}]})
    wait_until(lambda: ctl.api.node_state("n1") == "repair", lambda: f"n1 in repair: {ctl.api.node_state('n1')}", 60)
    ctl.api.post("/nodes/n1/repair-complete", {"reason": "recabled"})
    a = _waiting(ctl, "n1", "validate", "validation")
    job, partner = a["progress"]["validation"], a["progress"]["partners"]
    assert a["progress"]["level"] == "multinode" and partner in ("n2", "n3")
    wait_until(lambda: lab.job_state(job) == "RUNNING", lambda: f"pairing job {job} running: {lab.job_state(job)}",
               30)

    fleet.kill_controller()
    fleet.restart_controller()
    again = _waiting(ctl, "n1", "validate", "validation")
    assert (again["progress"]["validation"], again["progress"]["partners"]) == (job, partner)
    wait_until(lambda: _action(ctl, "n1", "validate") != again, "another pass over the validate action", 30)
    assert _validation_jobs(lab, a["id"]) == [job]

    pl.gate.touch()  # the check measures the pair and posts its verdict to the restarted controller
    wait_until(lambda: ctl.api.node_state("n1") == "ready", lambda: f"n1 ready: {ctl.api.node_state('n1')}", 120)
    assert _validation_jobs(lab, a["id"]) == [job], "one pairing job, ever"
    assert len(_audits(ctl, "n1", "validation_partners")) == 1
    wait_until(lambda: ctl.api.node_state(partner) == "ready", f"partner {partner} ready again", 30)
