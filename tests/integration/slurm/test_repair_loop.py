"""The repair loop on the real Slurm lab, closed with no operator call: a real agent process (simulated
GPUs) reports a fault, the controller drains the node in Slurm, hands it to repair, the escalation
ladder queues a repair command, the agent carries it out through the authenticated command channel,
the node is revalidated by a Slurm job in a maintenance reservation and returns to service — or, when
the fault keeps coming back, goes to people with a hardware ticket (a real webhook receiver)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from gpufleet.controller.settings import RepairSettings
from gpufleet.schedulers.slurm import SlurmScheduler
from gpufleet.schedulers.slurm.validation import SlurmValidator, ValidationJobs, reservation_of
from tests.integration.reconciler.test_repair_ladder import Tickets
from tests.integration.slurm.controller import AGENT_TOKEN, POLICY, LabController
from tests.integration.slurm.lab import SlurmLab, wait_for
from tests.integration.slurm.test_loop import _history, _never_starting, _verdict_script

pytestmark = [pytest.mark.slurm, pytest.mark.loop]
GPUFLEET = str(Path(sys.executable).with_name("gpufleet"))
LOOP_POLICY = POLICY.replace("auto_repair = false\n", "auto_repair = true\nheartbeat_timeout = \"0s\"\n")


@pytest.fixture
def tickets() -> Iterator[Tickets]:
    t = Tickets()
    yield t
    t.server.shutdown()


class AgentProcess:
    """``gpufleet agent --device sim`` as its own process, pushing to the lab controller. ``config``:
    top-level agent settings added to its config file (e.g. ``maintenance_scripts``)."""

    def __init__(self, tmp: Path, node: str, url: str, inject: str = "", config: str = "") -> None:
        token = tmp / f"{node}-token"
        token.write_text(AGENT_TOKEN)
        conf = tmp / f"{node}-agent.toml"
        conf.write_text(f"{config}command_poll_s = 0.3\nheartbeat_s = 1\n[cadence]\nslow_s = 0.5\n")
        self.log = tmp / f"{node}-agent.log"
        self.proc = subprocess.Popen(
            [GPUFLEET, "agent", "--device", "sim", "--gpus", "2", "--node", node, "--controller", url,
             "--token-file", str(token), "--state-dir", str(tmp / f"{node}-state"), "--no-kmsg",
             "--metrics-port", "0", "--metrics-addr", "127.0.0.1", "--config", str(conf),
             *(("--inject", inject) if inject else ())],
            stdout=self.log.open("w"), stderr=subprocess.STDOUT)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _validator(lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path) -> tuple[SlurmValidator, Path, Path]:
    url_file, verdict = _verdict_script(tmp_path)
    jobs = ValidationJobs((tmp_path / "command").read_text(), "root", time_limit=timedelta(minutes=5),
                          output=str(lab.root / "jobs" / "validate-%j.out"))
    return SlurmValidator(sched, jobs, slurm_conf=lab.slurm_conf), url_file, verdict


def test_a_gpu_reset_by_the_agent_returns_the_node_to_service_with_no_operator_call(
        lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path, tickets: Tickets) -> None:
    validator, url_file, verdict = _validator(lab, sched, tmp_path)
    verdict.write_text("pass")
    ctl = LabController.start(tmp_path, sched, lab.nodes, policy_text=LOOP_POLICY, validator=validator,
                              repair=RepairSettings(agent=True, ticket_url=tickets.url))
    url_file.write_text(ctl.url.removesuffix("/v1"))
    agent = AgentProcess(tmp_path, "n1", ctl.url.removesuffix("/v1"), "ecc_dbe@gpu0")  # catalog: reset_gpu
    try:
        wait_for(lambda: ctl.node_state("n1") == "ready" and ("revalidate", "ready") in _history(ctl, "n1"),
                 lambda: f"n1 back in service; history {_history(ctl, 'n1')}; agent log "
                         f"{agent.log.read_text()[-2000:]}", timeout=90)
        path = _history(ctl, "n1")
        start = path.index(("draining", "drained"))  # what follows ready (a job: in_service) may come meanwhile
        assert path[start:start + 4] == [
            ("draining", "drained"), ("drained", "repair"), ("repair", "revalidate"), ("revalidate", "ready")], path
        results = [a["detail"] for a in ctl.audit("n1") if a["action"] == "repair_result"]
        assert len(results) == 1 and "gpu_reset" in results[0] and "succeeded: simulated GPU reset: 1 GPU(s)" \
            in results[0], results
        validate = next(a for a in ctl.actions("n1") if a["kind"] == "validate")
        assert validate["level"] == "quick" and sched.job(validate["progress"]["validation"]).nodes == ("n1",)
        assert all(d["actor"] != "operator" for d in ctl.decisions("n1")), "no operator call"
        assert tickets.bodies == []
        _action_done = next(a for a in ctl.actions("n1") if a["kind"] == "resume")
        wait_for(lambda: next(a for a in ctl.actions("n1") if a["kind"] == "resume")["status"] == "done", "resumed")
        assert "DRAIN" not in sched.slurm_node("n1").flags and _action_done is not None
        work = lab.sbatch("n1", "echo ran-on-$SLURMD_NODENAME")
        wait_for(lambda: lab.job_state(work) == "COMPLETED", "n1 takes work again")
    finally:
        agent.stop()
        ctl.stop()
        lab.cmd("scontrol", "delete", f"reservationname={reservation_of('n1')}", check=False)


def test_a_fault_that_returns_after_two_reboots_goes_to_a_hardware_ticket(
        lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path, tickets: Tickets) -> None:
    validator, url_file, verdict = _validator(lab, sched, tmp_path)
    verdict.write_text("fail")  # the fault is still there after every reboot
    ctl = LabController.start(tmp_path, sched, lab.nodes, policy_text=LOOP_POLICY, validator=validator,
                              repair=RepairSettings(agent=True, ticket_url=tickets.url))
    url_file.write_text(ctl.url.removesuffix("/v1"))
    agent = AgentProcess(tmp_path, "n2", ctl.url.removesuffix("/v1"), "gpu_lost@gpu0")  # XID 79: reboot
    try:
        wait_for(lambda: len(tickets.bodies) == 1, lambda: f"a hardware ticket; history {_history(ctl, 'n2')}; "
                 f"audit {[(a['action'], a['detail']) for a in ctl.audit('n2')][:8]}", timeout=120)
        body = tickets.bodies[0]
        assert body["node"] == "n2" and body["kind"] == "hardware" and body["fault"]["key"] == "xid:79"
        assert [h["step"] for h in body["history"]] == ["reboot", "reboot"]
        assert body["reason"].startswith("xid:79 came back after 2 reboots within 7d")
        assert ctl.node_state("n2") == "repair" and "DRAIN" in sched.slurm_node("n2").flags
        validations = [a for a in ctl.audit("n2") if a["action"] == "validation_job"]
        assert len(validations) == 2, "each reboot was followed by a validation job in Slurm"
        wait_for(lambda: not _reserved(lab, "n2"), "the reservation is deleted once n2 is drained again")
    finally:
        agent.stop()
        ctl.stop()
        lab.cmd("scontrol", "delete", f"reservationname={reservation_of('n2')}", check=False)


def test_a_validation_job_that_never_starts_after_a_reboot_does_not_climb_the_ladder(
        lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path, tickets: Tickets) -> None:
    """A review's case: the validation after a reboot could not start (its partition down), was cancelled
    at validation_start_timeout, and the ladder took that for the fault coming back: a second reboot, then
    a hardware ticket, for a scheduling problem. A run that never started says nothing about the GPU: the
    node waits in repair for people with the ladder where it was."""
    _, url_file, verdict = _validator(lab, sched, tmp_path)
    verdict.write_text("pass")
    jobs, policy = _never_starting(lab, tmp_path, LOOP_POLICY)
    ctl = LabController.start(tmp_path, sched, lab.nodes, policy_text=policy,
                              validator=SlurmValidator(sched, jobs, slurm_conf=lab.slurm_conf),
                              repair=RepairSettings(agent=True, ticket_url=tickets.url))
    url_file.write_text(ctl.url.removesuffix("/v1"))
    agent = AgentProcess(tmp_path, "n2", ctl.url.removesuffix("/v1"), "gpu_lost@gpu0")  # XID 79: reboot
    try:
        def second_repair() -> dict[str, object] | None:
            repairs = [a for a in ctl.actions("n2") if a["kind"] == "repair"]
            return repairs[0] if len(repairs) == 2 and repairs[0]["status"] != "pending" else None

        wait_for(lambda: second_repair() is not None, lambda: f"n2 back in repair and its repair action carried "
                 f"out; history {_history(ctl, 'n2')}; actions {[(a['kind'], a['status']) for a in ctl.actions('n2')]}",
                 timeout=120)
        cancelled = [a["detail"] for a in ctl.audit("n2") if a["action"] == "validation_cancelled"]
        assert len(cancelled) == 1 and "never started: pending (" in cancelled[0], cancelled
        again = second_repair()
        assert again is not None and again["status"] == "done", again
        assert str(again["result"]).startswith("no repair step: the validation never ran (validation job "), again
        assert "ladder stays where it was" in str(again["result"])
        results = [a["detail"] for a in ctl.audit("n2") if a["action"] == "repair_result"]
        assert len(results) == 1 and results[0].startswith("reboot ("), "one reboot: the one the run never checked"
        (held,) = [a["detail"] for a in ctl.audit("n2") if a["action"] == "repair_not_climbed"]
        assert "xid:79" in held
        assert tickets.bodies == [] and ctl.node_state("n2") == "repair"
        wait_for(lambda: "DRAIN" in sched.slurm_node("n2").flags, "n2 drained again")
        wait_for(lambda: not _reserved(lab, "n2"), "the reservation is deleted")
    finally:
        agent.stop()
        ctl.stop()
        lab.cmd("scontrol", "update", "PartitionName=high", "State=UP")
        lab.cmd("scontrol", "delete", f"reservationname={reservation_of('n2')}", check=False)


def _reserved(lab: SlurmLab, node: str) -> bool:
    return lab.cmd("scontrol", "show", "reservation", reservation_of(node), check=False).returncode == 0
