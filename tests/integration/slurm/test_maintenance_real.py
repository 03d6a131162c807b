"""Protected rolling maintenance on the real Slurm lab: a real controller (store, reconciler, HTTP API)
drives slurmctld; real agent processes (simulated GPUs) run the maintenance script they name in their
own config, through the command channel; each node is revalidated by a Slurm job in a maintenance
reservation (the check stand-in of test_loop) before it returns. Crash safety (SIGKILL of a real
``gpufleet controller serve`` mid-rollout): tests/e2e/test_maintenance_crash.py."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpufleet.schedulers.slurm import SlurmScheduler
from gpufleet.schedulers.slurm.validation import SlurmValidator, ValidationJobs, reservation_of
from tests.integration.slurm.controller import LabController
from tests.integration.slurm.lab import SlurmLab, wait_for
from tests.integration.slurm.test_loop import GPUFLEET, _verdict_script
from tests.integration.slurm.test_repair_loop import AgentProcess

pytestmark = [pytest.mark.slurm, pytest.mark.fleetops]


def script_config(runs: Path, *, fail: bool = False, gate: Path | None = None) -> str:
    """An agent config naming one maintenance script, ``update``: it appends the node's name to ``runs``
    (how often it ran, and where), waits for ``gate`` when given, and exits 1 when ``fail``."""
    body = f'echo "$GPUFLEET_NODE" >> {shlex.quote(str(runs))}'
    if gate is not None:
        body += f"; while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.1; done"
    if fail:
        body += "; echo 'firmware flash failed: checksum mismatch' >&2; exit 1"
    return f"maintenance_scripts = {{ update = {json.dumps(['bash', '-c', body])} }}\n"


class Lab:
    """The lab's controller with a Slurm validator, and one agent per node."""

    def __init__(self, lab: SlurmLab, sched: SlurmScheduler, tmp: Path, configs: dict[str, str]) -> None:
        url_file, verdict = _verdict_script(tmp)
        verdict.write_text("pass")
        jobs = ValidationJobs((tmp / "command").read_text(), "root", time_limit=timedelta(minutes=5),
                              output=str(lab.root / "jobs" / "validate-%j.out"))
        self.lab, self.sched = lab, sched
        self.ctl = LabController.start(tmp, sched, lab.nodes,
                                       validator=SlurmValidator(sched, jobs, slurm_conf=lab.slurm_conf))
        url_file.write_text(self.ctl.url.removesuffix("/v1"))
        self.agents = [AgentProcess(tmp, n, self.ctl.url.removesuffix("/v1"), config=c) for n, c in configs.items()]

    def stop(self) -> None:
        for a in self.agents:
            a.stop()
        self.ctl.stop()
        for n in self.lab.nodes:
            self.lab.cmd("scontrol", "delete", f"reservationname={reservation_of(n)}", check=False)

    def plan(self, **body: Any) -> str:
        r = self.ctl.admin.post("/maintenance", json=body)
        assert r.status_code == 201, r.text
        rid: str = r.json()["id"]
        return rid

    def post(self, rid: str, verb: str) -> dict[str, Any]:
        r = self.ctl.admin.post(f"/maintenance/{rid}/{verb}", json={"reason": f"test {verb}"})
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    def status(self, rid: str) -> dict[str, Any]:
        out: dict[str, Any] = self.ctl.admin.get(f"/maintenance/{rid}").json()
        return out

    def steps(self, rid: str) -> dict[str, str]:
        return {n["node"]: n["step"] for n in self.status(rid)["nodes"]}

    def wait_state(self, rid: str, state: str, timeout: float = 120) -> dict[str, Any]:
        wait_for(lambda: self.status(rid)["state"] == state,
                 lambda: f"rollout {state}: {self.status(rid)}; agent logs: "
                         f"{[a.log.read_text()[-600:] for a in self.agents]}", timeout=timeout)
        return self.status(rid)

    def a_pass_after(self, rid: str) -> None:
        """Wait for one whole runner pass after now (instead of sleeping: the pass that could act has run)."""
        mark = self.status(rid)["last_pass"]
        wait_for(lambda: self.status(rid)["last_pass"] != mark, "another maintenance pass", timeout=20)
        mark = self.status(rid)["last_pass"]
        wait_for(lambda: self.status(rid)["last_pass"] != mark, "one more maintenance pass", timeout=20)

    def out_intervals(self, node: str) -> list[tuple[datetime, datetime | None]]:
        """When ``node`` was out of service (left ready/in_service .. came back), from its history."""
        hist = self.ctl.admin.get(f"/nodes/{node}").json()["history"][::-1]
        spans: list[tuple[datetime, datetime | None]] = []
        start: datetime | None = None
        for t in hist:
            at = datetime.fromisoformat(t["time"])
            if t["to_state"] in ("draining", "drained", "repair", "revalidate") and start is None:
                start = at
            elif t["to_state"] in ("ready", "in_service") and start is not None:
                spans.append((start, at))
                start = None
        if start is not None:
            spans.append((start, None))
        return spans


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "maintenance-runs"


@pytest.fixture
def env(lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Lab]:
    configs: dict[str, str] = request.param(tmp_path / "maintenance-runs", tmp_path)
    world = Lab(lab, sched, tmp_path, configs)
    try:
        yield world
    finally:
        world.stop()


def _all_update(runs: Path, _tmp: Path) -> dict[str, str]:
    return {n: script_config(runs) for n in ("n1", "n2", "n3")}


def _n1_fails(runs: Path, _tmp: Path) -> dict[str, str]:
    return {"n1": script_config(runs, fail=True), "n2": script_config(runs)}


def _n1_gated(runs: Path, tmp: Path) -> dict[str, str]:
    return {"n1": script_config(runs, gate=tmp / "go"), "n3": script_config(runs)}


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


@pytest.mark.parametrize("env", [_all_update], indirect=True)
def test_a_rollout_in_batches_checkpoints_the_running_job_first_and_returns_every_node(
        env: Lab, lab: SlurmLab, sched: SlurmScheduler, runs: Path, tmp_path: Path) -> None:
    got = tmp_path / "got-signal"
    ckpt = (f"trap 'echo USR1 >> {got}; {shlex.quote(GPUFLEET)} slurm checkpoint' USR1; "
            "while true; do sleep 0.2; done")
    job = lab.sbatch("n2", ckpt, "--comment", "pretrain gpufleet:signal=USR1")  # pinned to n2 (-w n2)
    wait_for(lambda: env.ctl.node_state("n2") == "in_service", "the controller sees the job on n2")
    rid = env.plan(selector="all", action="script:update", max_unavailable=2, max_unavailable_domain=2)
    assert env.status(rid)["batches"] == [["n1", "n2"], ["n3"]]
    env.post(rid, "start")
    done = env.wait_state(rid, "done", timeout=150)
    assert {n["node"]: n["step"] for n in done["nodes"]} == {"n1": "done", "n2": "done", "n3": "done"}
    assert sorted(_lines(runs)) == ["n1", "n2", "n3"], "each node's script ran exactly once"
    assert _lines(got) == ["USR1"], "the job was asked to checkpoint once"
    audit = env.ctl.audit("n2")[::-1]  # oldest first
    order = [a["action"] for a in audit]
    assert order.index("checkpoint_request") < order.index("maintenance_action"), order
    assert f"asked job {job} to checkpoint (SIGUSR1)" in audit[order.index("checkpoint_request")]["detail"]
    drain = env.ctl.action("n2", "drain_after_checkpoint")
    assert drain is not None and str(drain["result"]).startswith("drained after checkpoint at"), drain
    # requeued once, from the checkpoint it wrote, and it continues: Slurm holds a requeued job back for
    # about two minutes (begin time); lift that, and it runs again on its node, now back in service
    assert sched.job(job).restarts == 1 and lab.job_state(job) in ("PENDING", "RUNNING"), lab.job_state(job)
    lab.cmd("scontrol", "update", f"jobid={job}", "starttime=now", check=False)
    wait_for(lambda: lab.job_state(job) == "RUNNING", lambda: f"job {job} running again: {lab.job_state(job)}",
             timeout=60)
    assert sched.job(job).restarts == 1
    lab.cmd("scancel", str(job), check=False)  # it runs forever: leave no job for the next test's reset
    spans = [s for n in lab.nodes for s in env.out_intervals(n)]
    assert all(end is not None for _, end in spans), spans
    most = max(sum(1 for s, e in spans if s <= t < (e or t)) for t, _ in spans)
    assert most == 2, f"at most max_unavailable (2) out at once, and the first batch was 2: {spans}"
    for n in lab.nodes:
        assert "DRAIN" not in sched.slurm_node(n).flags
        validations = [a for a in env.ctl.audit(n) if a["action"] == "validation_job"]
        assert len(validations) == 1, (n, validations)


@pytest.mark.parametrize("env", [_n1_fails], indirect=True)
def test_a_failing_action_stops_the_rollout_and_the_node_stays_out_of_service(
        env: Lab, lab: SlurmLab, sched: SlurmScheduler, runs: Path) -> None:
    rid = env.plan(selector="nodes:n1,n2", action="script:update")
    env.post(rid, "start")
    stopped = env.wait_state(rid, "stopped")
    assert "n1 failed" in stopped["reason"]
    n1 = next(n for n in stopped["nodes"] if n["node"] == "n1")
    assert n1["step"] == "failed" and "checksum mismatch" in n1["detail"], n1
    env.a_pass_after(rid)
    assert env.steps(rid) == {"n1": "failed", "n2": "pending"}, "nothing else starts"
    assert env.ctl.node_state("n1") == "repair" and "DRAIN" in sched.slurm_node("n1").flags
    assert "DRAIN" not in sched.slurm_node("n2").flags
    assert _lines(runs) == ["n1"]
    assert not [a for a in env.ctl.actions("n1") if a["kind"] in ("validate", "resume")], "never returned"


@pytest.mark.parametrize("env", [_n1_gated], indirect=True)
def test_pause_lets_the_node_in_flight_finish_and_starts_nothing_then_abort_skips_the_rest(
        env: Lab, lab: SlurmLab, sched: SlurmScheduler, runs: Path, tmp_path: Path) -> None:
    rid = env.plan(selector="nodes:n1,n3", action="script:update")
    env.post(rid, "start")
    wait_for(lambda: _lines(runs) == ["n1"], "n1's script running")
    assert env.post(rid, "pause")["state"] == "paused"
    (tmp_path / "go").touch()  # n1's script ends: it is validated and returns, paused or not
    wait_for(lambda: env.steps(rid)["n1"] == "done", lambda: f"n1 done: {env.status(rid)}", timeout=90)
    env.a_pass_after(rid)
    assert env.steps(rid)["n3"] == "pending" and "DRAIN" not in sched.slurm_node("n3").flags
    r = env.ctl.admin.post(f"/maintenance/{rid}/pause", json={})
    assert r.status_code == 409 and "paused" in r.json()["detail"]
    aborted = env.post(rid, "abort")
    assert aborted["state"] == "aborted" and env.steps(rid) == {"n1": "done", "n3": "skipped"}
    assert _lines(runs) == ["n1"] and "DRAIN" not in sched.slurm_node("n1").flags
