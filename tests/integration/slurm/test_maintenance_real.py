"""Protected rolling maintenance on the real Slurm lab: a real controller (store, reconciler, HTTP API)
drives slurmctld; real agent processes (simulated GPUs) carry out the action through the command
channel (a maintenance script they name in their own config, or a reboot, which a simulated node
simulates); each node is revalidated by a Slurm job in a maintenance reservation (the check stand-in of
test_loop) before it returns. The first tests run on the session's three-node lab; the rolling reboot of
issue #19 (eight nodes, max_unavailable 2) on a lab of its own with eight slurmd (``fleet_lab``). Crash
safety (SIGKILL of a real ``gpufleet controller serve`` mid-rollout): tests/e2e/test_maintenance_crash.py."""

from __future__ import annotations

import json
import shlex
import signal
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpufleet.schedulers.slurm import SlurmScheduler
from gpufleet.schedulers.slurm.validation import SlurmValidator, ValidationJobs, reservation_of
from tests.integration.slurm.controller import LabController
from tests.integration.slurm.lab import FLEET_NODES, SlurmLab, wait_for
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
        """Every node of ``lab`` registered ready; an agent for each node of ``configs`` (node -> the
        agent's extra config)."""
        url_file, verdict = _verdict_script(tmp)
        verdict.write_text("pass")
        jobs = ValidationJobs((tmp / "command").read_text(), "root", time_limit=timedelta(minutes=5),
                              output=str(lab.root / "jobs" / "validate-%j.out"))
        self.lab, self.sched, self.tmp = lab, sched, tmp
        self.ctl = LabController.start(tmp, sched, lab.nodes,
                                       validator=SlurmValidator(sched, jobs, slurm_conf=lab.slurm_conf))
        url_file.write_text(self.ctl.url.removesuffix("/v1"))
        self.agents = [AgentProcess(tmp, n, self.ctl.url.removesuffix("/v1"), config=c) for n, c in configs.items()]

    def stop(self) -> None:
        for a in self.agents:  # all told at once (each takes a while to stop), then each waited for
            a.proc.send_signal(signal.SIGTERM)
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

    def journal(self, node: str) -> list[dict[str, Any]]:
        """The commands ``node``'s agent ran, from its own journal (agent/commands.py: written before a
        command runs, so a command run twice would show twice)."""
        path = self.tmp / f"{node}-state" / "commands.json"
        return list(json.loads(path.read_text()).values()) if path.exists() else []


def most_out_at_once(spans: list[tuple[datetime, datetime | None]]) -> int:
    """The most intervals that overlap at any instant (an open interval never ends). The count is
    highest at some interval's start, so counting at each start is enough."""
    far = datetime.max.replace(tzinfo=spans[0][0].tzinfo) if spans else datetime.max
    return max((sum(1 for s, e in spans if s <= t < (e or far)) for t, _ in spans), default=0)


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "maintenance-runs"


def _world(lab: SlurmLab, sched: SlurmScheduler, tmp: Path, request: pytest.FixtureRequest) -> Iterator[Lab]:
    """The test's controller and agents; ``request.param(runs, tmp)`` names the agents' configs."""
    configs: dict[str, str] = request.param(tmp / "maintenance-runs", tmp)
    world = Lab(lab, sched, tmp, configs)
    try:
        yield world
    finally:
        world.stop()


@pytest.fixture
def env(lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Lab]:
    """On the session's three-node lab."""
    yield from _world(lab, sched, tmp_path, request)


@pytest.fixture
def fleet(fleet_lab: SlurmLab, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Lab]:
    """On the module's eight-node lab (conftest.fleet_lab)."""
    yield from _world(fleet_lab, SlurmScheduler(slurm_conf=fleet_lab.slurm_conf), tmp_path, request)


def _all_update(runs: Path, _tmp: Path) -> dict[str, str]:
    return {n: script_config(runs) for n in ("n1", "n2", "n3")}


def _n1_fails(runs: Path, _tmp: Path) -> dict[str, str]:
    return {"n1": script_config(runs, fail=True), "n2": script_config(runs)}


def _n1_gated(runs: Path, tmp: Path) -> dict[str, str]:
    return {"n1": script_config(runs, gate=tmp / "go"), "n3": script_config(runs)}


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def checkpointing_job(lab: SlurmLab, node: str, got: Path) -> str:
    """A training job pinned to ``node`` (``-w``) that opted in to checkpoint requests: on SIGUSR1 it
    appends ``USR1`` to ``got`` and reports a checkpoint (``gpufleet slurm checkpoint``, the job-comment
    carrier); it runs until cancelled."""
    ckpt = (f"trap 'echo USR1 >> {got}; {shlex.quote(GPUFLEET)} slurm checkpoint' USR1; "
            "while true; do sleep 0.2; done")
    return lab.sbatch(node, ckpt, "--comment", "pretrain gpufleet:signal=USR1")


@pytest.mark.parametrize("env", [_all_update], indirect=True)
def test_a_rollout_in_batches_checkpoints_the_running_job_first_and_returns_every_node(
        env: Lab, lab: SlurmLab, sched: SlurmScheduler, runs: Path, tmp_path: Path) -> None:
    got = tmp_path / "got-signal"
    job = checkpointing_job(lab, "n2", got)
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
    assert order.index("checkpoint_request") < order.index("checkpoint_signal")  # recorded before it is sent
    assert f"asked job {job} to checkpoint (SIGUSR1)" in audit[order.index("checkpoint_signal")]["detail"]
    drain = env.ctl.action("n2", "drain_after_checkpoint")
    assert drain is not None and str(drain["result"]).startswith("drained after checkpoint at"), drain
    # requeued once, from the checkpoint it wrote, and it continues: Slurm holds a requeued job back for
    # about two minutes (begin time); lift that, and it runs again on its node, now back in service
    assert sched.job(job).restarts == 1 and lab.job_state(job) in ("PENDING", "RUNNING"), lab.job_state(job)
    lab.lift_requeue_hold(job)
    wait_for(lambda: lab.job_state(job) == "RUNNING", lambda: f"job {job} running again: {lab.job_state(job)}",
             timeout=60)
    assert sched.job(job).restarts == 1
    lab.cmd("scancel", str(job), check=False)  # it runs forever: leave no job for the next test's reset
    spans = [s for n in lab.nodes for s in env.out_intervals(n)]
    assert all(end is not None for _, end in spans), spans
    assert most_out_at_once(spans) == 2, f"at most max_unavailable (2) out at once, and the first batch was 2: {spans}"
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


# ---- issue #19: a rolling reboot of eight nodes, max_unavailable 2 (the module's eight-node lab) ----------

FLEET = [f"n{i}" for i in range(1, FLEET_NODES + 1)]


def _every_node_reboots(_runs: Path, _tmp: Path) -> dict[str, str]:
    return dict.fromkeys(FLEET, "")  # nothing to name: ``reboot`` is the agent's own command


def _n4_fails_while_n3_is_out(runs: Path, tmp: Path) -> dict[str, str]:
    """n1, n2: the script works. n3's writes ``n3-started`` and holds until ``go``; n4's waits until n3's
    has started, then fails. No agent on n5..n8: nothing may be asked of them."""
    started = tmp / "n3-started"
    return {"n1": script_config(runs), "n2": script_config(runs), "n3": script_config(started, gate=tmp / "go"),
            "n4": script_config(runs, gate=started, fail=True)}


@pytest.mark.parametrize("fleet", [_every_node_reboots], indirect=True)
def test_a_rolling_reboot_of_eight_nodes_keeps_at_most_two_out_and_the_job_checkpoints_and_continues(
        fleet: Lab, tmp_path: Path) -> None:
    """Issue #19: a rolling reboot of eight nodes with max_unavailable 2 while a job runs. ``reboot`` is the
    agent's own command (the command channel, the agent's at-most-once journal); a simulated node carries
    it out by simulating a reboot (its device resets): the lab cannot reboot its host. Every node is in
    rack r1 and max_unavailable_domain is the fleet's size, so max_unavailable alone limits what is out."""
    lab, sched, ctl = fleet.lab, fleet.sched, fleet.ctl
    got = tmp_path / "got-signal"
    job = checkpointing_job(lab, "n4", got)  # second batch: its turn comes with the rollout under way
    wait_for(lambda: ctl.node_state("n4") == "in_service", "the controller sees the job on n4")
    rid = fleet.plan(selector="all", action="reboot", max_unavailable=2, max_unavailable_domain=FLEET_NODES)
    assert fleet.status(rid)["batches"] == [["n1", "n2"], ["n3", "n4"], ["n5", "n6"], ["n7", "n8"]]
    fleet.post(rid, "start")
    # Requeued from its checkpoint, the job is held back by Slurm for about two minutes (begin time): lift
    # that at once, so it runs again as soon as n4 is back, while the rollout goes on.
    wait_for(lambda: sched.job(job).restarts == 1, lambda: f"job {job} requeued: {fleet.status(rid)}", timeout=90)
    lab.lift_requeue_hold(job)
    done = fleet.wait_state(rid, "done", timeout=180)
    assert {n["node"]: n["step"] for n in done["nodes"]} == dict.fromkeys(FLEET, "done"), done
    wait_for(lambda: lab.job_state(job) == "RUNNING", lambda: f"job {job} running again: {lab.job_state(job)}",
             timeout=60)
    again = sched.job(job)
    lab.cmd("scancel", job, check=False)  # it runs forever: leave no job for the next test's reset
    assert again.restarts == 1 and again.nodes == ("n4",), again
    assert _lines(got) == ["USR1"], "asked to checkpoint once: no later batch touched it"
    audit = [a["action"] for a in ctl.audit("n4")[::-1]]  # oldest first
    assert audit.index("checkpoint_request") < audit.index("maintenance_action"), audit
    drain = ctl.action("n4", "drain_after_checkpoint")
    assert drain is not None and str(drain["result"]).startswith("drained after checkpoint at"), drain
    # The controller's transition log: each node out once (draining .. back in service), never more than
    # max_unavailable at any instant, and the limit used (two at once).
    spans = {n: fleet.out_intervals(n) for n in FLEET}
    assert all(len(s) == 1 and s[0][1] is not None for s in spans.values()), spans
    assert most_out_at_once([s for ss in spans.values() for s in ss]) == 2, spans
    for n in FLEET:
        ran = [c for c in fleet.journal(n) if c["kind"] == "reboot"]
        assert len(ran) == 1 and ran[0]["ok"] and "simulated reboot" in ran[0]["detail"], (n, fleet.journal(n))
        assert [a["action"] for a in ctl.audit(n)].count("validation_job") == 1, n
        assert ctl.node_state(n) in ("ready", "in_service") and "DRAIN" not in sched.slurm_node(n).flags, n


@pytest.mark.parametrize("fleet", [_n4_fails_while_n3_is_out], indirect=True)
def test_one_failed_node_stops_the_eight_node_rollout_and_later_batches_are_never_touched(
        fleet: Lab, tmp_path: Path) -> None:
    """A simulated node's reboot cannot fail, so the failure is injected in the rollout's other kind of
    action, a maintenance script: n4's exits 1. Its batch-mate n3 holds its script until the rollout has
    stopped, so n4 surely fails with two nodes out (no later node can have started before the stop); n3,
    in flight, then finishes and returns; n4 stays out; n5..n8 are never drained nor sent anything."""
    sched, ctl, runs = fleet.sched, fleet.ctl, tmp_path / "maintenance-runs"
    rid = fleet.plan(selector="all", action="script:update", max_unavailable=2, max_unavailable_domain=FLEET_NODES)
    fleet.post(rid, "start")
    stopped = fleet.wait_state(rid, "stopped", timeout=120)
    assert "n4 failed" in stopped["reason"], stopped
    later = dict.fromkeys(FLEET[4:], "pending")
    assert fleet.steps(rid) == {"n1": "done", "n2": "done", "n3": "action", "n4": "failed", **later}
    (tmp_path / "go").touch()  # n3's script ends: in flight, it is validated and returns though stopped
    wait_for(lambda: fleet.steps(rid)["n3"] == "done", lambda: f"n3 done: {fleet.status(rid)}", timeout=90)
    fleet.a_pass_after(rid)
    now = fleet.status(rid)
    assert now["state"] == "stopped" and fleet.steps(rid) == {
        "n1": "done", "n2": "done", "n3": "done", "n4": "failed", **later}, now
    n4 = next(n for n in now["nodes"] if n["node"] == "n4")
    assert "checksum mismatch" in n4["detail"], n4
    assert ctl.node_state("n4") == "repair" and "DRAIN" in sched.slurm_node("n4").flags
    assert not [a for a in ctl.actions("n4") if a["kind"] in ("validate", "resume")], "never returned"
    assert sorted(_lines(runs)) == ["n1", "n2", "n4"] and _lines(tmp_path / "n3-started") == ["n3"]
    for n in FLEET[4:]:
        assert ctl.node_state(n) == "ready" and fleet.out_intervals(n) == [], n
        assert "DRAIN" not in sched.slurm_node(n).flags, n
        assert not [a for a in ctl.audit(n) if a["action"].startswith("maintenance_")], n
        assert ctl.actions(n) == [], (n, ctl.actions(n))
    assert most_out_at_once([s for n in FLEET for s in fleet.out_intervals(n)]) == 2
