"""A fabric fault's validation on the real Slurm lab: the repaired node is paired with known-good,
idle nodes in ONE Slurm job spanning them (``srun`` over the node's maintenance reservation, which
takes the partners too), running the real ``gpufleet check --level multinode --known-good ...`` on
the CPU path (gloo between the lab's nodes). Pass → the node returns to service and the partners are
free again; a slow node fails the check → back to repair, and no partner is blamed."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path

import pytest

from gpufleet.checks.collective import free_port
from gpufleet.schedulers.port import RunStatus
from gpufleet.schedulers.slurm import SlurmScheduler
from gpufleet.schedulers.slurm.validation import SlurmValidator, ValidationJobs, reservation_of
from tests.integration.slurm.controller import AGENT_TOKEN, POLICY, LabController
from tests.integration.slurm.lab import SlurmLab, wait_for
from tests.integration.slurm.test_loop import _history, _reserved

pytestmark = [pytest.mark.slurm, pytest.mark.loop]

# No repair executor: an InfiniBand port down (catalog: check_cabling) is a job for people, who
# recable and call repair-complete; the validation that follows is what is under test.
PAIR_POLICY = POLICY.replace("auto_repair = false\n", 'auto_repair = true\nheartbeat_timeout = "0s"\n')


class PairLab:
    """A pairing command for the lab: one task per node, the real multinode check. ``validator`` gives
    the in-process controller's validator; ``pair_command`` goes into a controller.toml."""

    def __init__(self, lab: SlurmLab, tmp: Path, partners: int, token: str = AGENT_TOKEN) -> None:
        self.lab, self.partners = lab, partners
        self.url_file, self.slow, self.gate = tmp / "controller-url", tmp / "slow", tmp / "go"
        self.gate.touch()  # remove it to hold the job before it measures anything
        token_file = tmp / "check-token"
        token_file.write_text(token)
        script = tmp / "pair.sh"
        # The lab's nodes are all 127.0.0.1: rendezvous there on a free port; each task is the node
        # slurmd runs it for. With ``slow`` present the node under validation plays a bad link.
        script.write_text(
            "#!/bin/bash\nnode=$1 partners=$2\n"
            f"for _ in $(seq 600); do [ -e {self.gate} ] && break; sleep 0.2; done\n"
            f"export GPUFLEET_NODE_NAME=$SLURMD_NODENAME MASTER_ADDR=127.0.0.1 MASTER_PORT={free_port()}\n"
            f'if [ -e {self.slow} ] && [ "$SLURMD_NODENAME" = "$node" ]; then\n'
            '  export GPUFLEET_CHECK_TEST_DELAY="$SLURM_PROCID=0.1"\nfi\n'
            f"exec {shlex.quote(sys.executable)} -m gpufleet.cli check --level multinode --device cpu --json "
            f'--known-good "$partners" --controller "$(cat {self.url_file})" --token-file {token_file}\n')
        self.pair_command = f"srun bash {script} {{node}} {{partners}}"
        self.output = str(lab.root / "jobs" / "validate-%j.out")

    def validator(self, sched: SlurmScheduler) -> SlurmValidator:
        jobs = ValidationJobs("false {node} {level}", "root", time_limit=timedelta(minutes=5), output=self.output,
                              pair_command=self.pair_command, pair_partners=self.partners)
        return SlurmValidator(sched, jobs, slurm_conf=self.lab.slurm_conf)

    def config(self) -> str:
        """The same as a ``[validation]`` table of controller.toml."""
        return (f"[validation]\ncommand = 'false {{node}} {{level}}'\nuser = \"root\"\ntime_limit = \"5m\"\n"
                f"output = '{self.output}'\npair_command = '{self.pair_command}'\npair_partners = {self.partners}")


class JobLandsOnAPartner:
    """The race pairing leaves open: the first partner chosen is idle, and a job lands on it (whole node)
    before the validation's reservation is made, which lets it run (``ignore_jobs``); the pairing job waits
    for it. Otherwise the lab's validator."""

    def __init__(self, lab: SlurmLab, inner: SlurmValidator) -> None:
        self.lab, self.inner = lab, inner
        self.job, self.on = "", ""

    @property
    def partners(self) -> int:
        return self.inner.partners

    def request(self, node: str, level: str, key: str, partners: Sequence[str] = ()) -> str:
        if partners and not self.job:
            self.on, self.job = partners[0], self.lab.sbatch(partners[0], "sleep 600", "--exclusive")
            wait_for(lambda: self.lab.job_state(self.job) == "RUNNING", f"job {self.job} running on {self.on}")
        return self.inner.request(node, level, key, partners)

    def status(self, handle: str) -> RunStatus:
        return self.inner.status(handle)

    def cancel(self, handle: str) -> None:
        self.inner.cancel(handle)

    def release(self, node: str) -> None:
        self.inner.release(node)

    def holds(self, node: str) -> bool:
        return self.inner.holds(node)


@pytest.fixture
def cleanup(lab: SlurmLab) -> Iterator[None]:
    yield
    lab.cmd("scontrol", "delete", f"reservationname={reservation_of('n1')}", check=False)


def _to_validation(ctl: LabController, sched: SlurmScheduler) -> tuple[dict[str, object], tuple[str, ...]]:
    """InfiniBand port down on n1 → drained → repair (people) → repair-complete → the validation job."""
    ctl.post_event("n1", "link_down", component="n1-mlx5_0", link="n1-mlx5_0/1", attrs={"rule": "ib_down"},
                   message="mlx5_0 port 1 went down")
    wait_for(lambda: ctl.node_state("n1") == "repair", lambda: f"n1 in repair: {_history(ctl, 'n1')}", timeout=60)
    ctl.admin.post("/nodes/n1/repair-complete", json={"reason": "recabled"}).raise_for_status()
    wait_for(lambda: (a := ctl.action("n1", "validate")) is not None and bool((a["progress"] or {}).get("validation")),
             lambda: f"a validation job for n1: {ctl.action('n1', 'validate')}", timeout=60)
    a = ctl.action("n1", "validate")
    assert a is not None
    job = str(a["progress"]["validation"])
    wait_for(lambda: bool(sched.job(job).nodes), f"validation job {job} started on its nodes", timeout=60)
    return a, sched.job(job).nodes


def _ready(ctl: LabController, node: str) -> None:
    wait_for(lambda: ctl.node_state(node) == "ready", lambda: f"{node} ready: {_history(ctl, node)}")


def test_a_fabric_fault_is_validated_by_pairing_and_a_pass_returns_the_node(
        lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path, cleanup: None) -> None:
    pl = PairLab(lab, tmp_path, partners=1)
    ctl = LabController.start(tmp_path, sched, lab.nodes, policy_text=PAIR_POLICY, validator=pl.validator(sched))
    pl.url_file.write_text(ctl.url.removesuffix("/v1"))
    try:
        a, nodes = _to_validation(ctl, sched)
        progress = a["progress"]
        assert isinstance(progress, dict) and a["level"] == "full"  # planned after people's repair ...
        assert progress["level"] == "multinode"  # ... run as pairing: the fault was on the fabric
        partner = progress["partners"]
        assert partner in ("n2", "n3") and nodes == ("n1", partner), nodes
        wait_for(lambda: ctl.node_state("n1") == "ready", lambda: f"n1 ready: {_history(ctl, 'n1')}; job output "
                 f"{lab.job_output(str(progress['validation']))!r}", timeout=180)
        got = [e for e in ctl.admin.get("/events", params={"node": "n1", "kind": "check_passed"}).json()
               if "multinode_pair" in e["message"]]
        assert got and got[0]["attrs"]["peer"] == partner, got  # measured with its partner
        wait_for(lambda: not _reserved(lab, "n1"), "the reservation (node and partner) is released")
        # the partner ran the validation job (in_service while Slurm showed it): ready at the next pass
        # that sees it without the job, which may come after the reservation is gone (CI, 2026-11-27)
        wait_for(lambda: ctl.node_state(partner) == "ready", lambda: f"{partner} ready: {_history(ctl, partner)}")
        assert "DRAIN" not in sched.slurm_node(partner).flags
        work = lab.sbatch(partner, "echo ok")
        wait_for(lambda: lab.job_state(work) == "COMPLETED", "the partner takes work again")
        audit = [x["detail"] for x in ctl.audit("n1") if x["action"] == "validation_partners"]
        assert len(audit) == 1 and f"known-good {partner}" in audit[0]
    finally:
        ctl.stop()


def test_a_slow_node_fails_its_pairing_and_goes_back_to_repair_without_blaming_a_partner(
        lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path, cleanup: None) -> None:
    pl = PairLab(lab, tmp_path, partners=2)
    pl.slow.touch()
    ctl = LabController.start(tmp_path, sched, lab.nodes, policy_text=PAIR_POLICY, validator=pl.validator(sched))
    pl.url_file.write_text(ctl.url.removesuffix("/v1"))
    try:
        a, nodes = _to_validation(ctl, sched)
        assert sorted(nodes) == ["n1", "n2", "n3"], nodes
        job = str(a["progress"]["validation"])  # type: ignore[index]
        wait_for(lambda: ("revalidate", "repair") in _history(ctl, "n1"),
                 lambda: f"n1 back to repair: {_history(ctl, 'n1')}; job output {lab.job_output(job)!r}", timeout=180)
        failed = ctl.admin.get("/events", params={"node": "n1", "kind": "check_failed"}).json()
        assert any("slow with known-good peer" in e["message"] for e in failed), failed
        wait_for(lambda: "DRAIN" in sched.slurm_node("n1").flags, "n1 drained again")
        wait_for(lambda: not _reserved(lab, "n1"), "the reservation is released")
        for partner in ("n2", "n3"):  # (in_service while the validation job still ran on it)
            _ready(ctl, partner)
            assert ctl.admin.get("/events", params={"node": partner, "kind": "check_failed"}).json() == []
            assert "DRAIN" not in sched.slurm_node(partner).flags
        repairs = [x for x in ctl.actions("n1") if x["kind"] == "repair"]
        assert len(repairs) == 2, "repair again after the failed validation"
    finally:
        ctl.stop()


def test_a_partner_whose_job_outlives_the_deadline_is_replaced_and_nobody_is_failed(
        lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path, cleanup: None) -> None:
    """A review's case: a job landed on the chosen partner before the reservation, the pairing job waited
    for it past validation_start_timeout and was cancelled, and the node under validation failed (back to
    repair; with the ladder on, one rung up) for its partner being busy. A run that never started measured
    nothing: the node is paired again with a free partner, and neither is blamed."""
    pl = PairLab(lab, tmp_path, partners=1)
    racing = JobLandsOnAPartner(lab, pl.validator(sched))
    # 20 s: the first job waits for the partner's job whatever the deadline; the second must start within it,
    # and a node just resumed (n1, by the first request) is not available to Slurm until its next ping
    # (SlurmdTimeout 30 s: every ~10 s): with 3 s the second job failed in a run of the whole file
    policy = PAIR_POLICY.replace("[policy]\n", '[policy]\nvalidation_start_timeout = "20s"\n')
    ctl = LabController.start(tmp_path, sched, lab.nodes, policy_text=policy, validator=racing)
    pl.url_file.write_text(ctl.url.removesuffix("/v1"))
    try:
        ctl.post_event("n1", "link_down", component="n1-mlx5_0", link="n1-mlx5_0/1", attrs={"rule": "ib_down"},
                       message="mlx5_0 port 1 went down")
        wait_for(lambda: ctl.node_state("n1") == "repair", lambda: f"n1 in repair: {_history(ctl, 'n1')}", timeout=60)
        ctl.admin.post("/nodes/n1/repair-complete", json={"reason": "recabled"}).raise_for_status()
        wait_for(lambda: ctl.node_state("n1") == "ready" or ("revalidate", "repair") in _history(ctl, "n1"),
                 lambda: f"n1 validated: {_history(ctl, 'n1')}; {ctl.action('n1', 'validate')}", timeout=180)
        assert ("revalidate", "repair") not in _history(ctl, "n1"), "n1 failed for its partner's job"
        busy, other = racing.on, ({"n2", "n3"} - {racing.on}).pop()
        (said,) = [x["detail"] for x in ctl.audit("n1") if x["action"] == "validation_partners_busy"]
        assert f"partner(s) not free: {busy} (" in said and racing.job in said and "cancelled, not failed" in said
        first = said.split("validation job ", 1)[1].split(" ", 1)[0]
        assert lab.job_state(first) == "CANCELLED", "the pairing job that never started is cancelled"
        pairs = [x["detail"] for x in ctl.audit("n1") if x["action"] == "validation_partners"][::-1]
        assert len(pairs) == 2 and f"known-good {busy} " in pairs[0] + " " and pairs[1].endswith(
            f"known-good {other} (fabric fault)"), pairs
        got = [e for e in ctl.admin.get("/events", params={"node": "n1", "kind": "check_passed"}).json()
               if "multinode_pair" in e["message"]]
        assert got and got[0]["attrs"]["peer"] == other, got  # measured with the partner that was free
        for node in ("n1", busy):
            assert ctl.admin.get("/events", params={"node": node, "kind": "check_failed"}).json() == [], node
        assert lab.job_state(racing.job) == "RUNNING", "the partner's own job is left alone"
        wait_for(lambda: not _reserved(lab, "n1"), "the reservation is released")
    finally:
        ctl.stop()
        if racing.job:
            lab.cmd("scancel", racing.job, check=False)
