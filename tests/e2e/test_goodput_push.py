"""A training run's goodput reaches a real controller process: the push (by hand and from the recorder's
own background process), its idempotency, its behaviour with the controller down, and the straggler
finding judged on the event path."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.goodput.durable import RunRecorder, read_run
from gpufleet.goodput.intervals import run_intervals
from gpufleet.goodput.push import GoodputPusher
from gpufleet.goodput.runreport import run_report
from tests.e2e.harness import AGENT_TOKEN, Controller, Fleet, child_env, free_port, gpufleet_argv, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.goodput]
JOB = "1"  # the simulated scheduler's first job
NODES = {"n1": "r01", "n2": "r01"}


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def write_run(run: Path, t0: float, hosts: tuple[str, str] = ("n1", "n2")) -> None:
    """Two ranks on ``hosts`` (n1 and n2), 60 steps of 1 s (rank 1's compute 2x its peer's from step 30), a synchronous
    checkpoint every 10 steps, a crash after step 44 and a restart from step 40; ended."""
    for rank, host in enumerate(hosts):
        c = Clock(t0)
        rec = RunRecorder(run, rank=rank, world=2, launched=t0, monotonic=c, wall=c, fsync="never", push=False,
                          host=host)
        rec.model(3e12, peak_flops=1e13)
        c.t += 4
        step = 0
        while step < 60:
            with rec.step(step):
                with rec.compute():
                    c.t += 0.8 if rank == 1 and step >= 30 else 0.4
                c.t += 1.0 - (0.8 if rank == 1 and step >= 30 else 0.4)
            step += 1
            if step % 10 == 0:
                rec.checkpoint_start(step, step, is_async=False)
                c.t += 0.25
                rec.checkpoint_end(step)
            if step == 45 and not (run / f"crashed{rank}").exists():
                (run / f"crashed{rank}").touch()
                rec.close()
                c.t += 5
                rec = RunRecorder(run, rank=rank, world=2, launched=c.t, monotonic=c, wall=c, fsync="never",
                                  push=False, host=host)
                rec.model(3e12, peak_flops=1e13)
                c.t += 2
                rec.restore_start()
                c.t += 0.5
                rec.restore_end(40)
                step = 40
        rec.end()
        rec.close()


def push_cli(ctl: Controller, run: Path, expect: int = 0) -> dict[str, Any]:
    env = child_env({"GPUFLEET_CONTROLLER": ctl.url, "GPUFLEET_TOKEN_FILE": str(ctl.token_file),
                     "SLURM_JOB_ID": JOB})
    out = subprocess.run(gpufleet_argv("goodput", "push", str(run)), env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == expect, out.stderr + out.stdout
    doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


@pytest.fixture
def ctl(fleet: Fleet) -> Controller:
    return fleet.controller(nodes=NODES, sim_jobs=[(JOB, "train", ["n1", "n2"])])


def test_pushed_goodput_matches_the_run_report_and_a_second_push_counts_nothing_twice(ctl: Controller,
                                                                                      tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run(run, time.time() - 400)
    local = run_report(read_run(run))
    n = len(run_intervals(min(read_run(run), key=lambda lg: lg.rank)))
    first = push_cli(ctl, run)  # an agent token whose nodes run the job
    assert (first["accepted"], first["duplicates"], first["failed_posts"]) == (n, 0, 0)
    got = ctl.api.get(f"/jobs/{JOB}/goodput")
    assert len(got["intervals"]) == n
    total = got["total"]
    assert total["elapsed_s"] == pytest.approx(local.goodput.elapsed, abs=1e-3)
    assert total["productive_s"] == pytest.approx(local.goodput.productive, abs=1e-3)
    for k, v in local.goodput.badput.as_dict().items():
        assert total["badput_s"][k] == pytest.approx(v, abs=1e-3), k
    assert local.goodput.badput.lost_progress > 0 and local.restarts  # the crash is in what was pushed
    assert total["mfu"] == pytest.approx(3e12 / 1e13, rel=1e-3)  # 3 TFLOP in 1 s steps at a 10 TFLOP/s peak
    again = push_cli(ctl, run)
    assert (again["accepted"], again["duplicates"]) == (0, n)
    assert ctl.api.get(f"/jobs/{JOB}/goodput")["total"] == total
    cluster = ctl.api.get("/goodput")
    assert cluster["cluster"]["productive_s"] == pytest.approx(2 * local.goodput.productive, abs=1e-2)  # 2 ranks
    assert [j["job"] for j in cluster["jobs"]] == [JOB]


def test_the_straggler_is_posted_once_on_the_event_path_for_the_slow_ranks_node(ctl: Controller,
                                                                                 tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run(run, time.time() - 400)
    assert [s.host for s in run_report(read_run(run)).stragglers] == ["n2"]
    assert push_cli(ctl, run)["stragglers_posted"] == 1
    events = [e for e in ctl.api.events("n2", kind="check_failed") if e["attrs"].get("rule") == "straggler"]
    assert len(events) == 1
    e = events[0]
    assert e["component"] in (None, "n2")  # no LOCAL_RANK recorded: the node, not a GPU
    assert e["attrs"]["job"] == JOB and e["attrs"]["rank"] == "1"
    assert e["severity"] == "degraded"  # judged by the controller from the catalog row check_failed/straggler
    wait_until(lambda: ctl.api.decisions("n2"), "a decision for the straggler's node")
    assert ctl.api.events("n1", kind="check_failed") == []
    assert push_cli(ctl, run)["stragglers_posted"] == 0  # remembered in the run directory: posted once
    assert len([e for e in ctl.api.events("n2", kind="check_failed")]) == 1


def test_a_straggler_on_a_node_the_controller_does_not_know_is_refused_and_sent_again_once_it_is_registered(
        ctl: Controller, tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run(run, time.time() - 400, hosts=("n1", "n3"))  # n3: not registered (yet)
    assert [s.host for s in run_report(read_run(run)).stragglers] == ["n3"]
    first = push_cli(ctl, run, expect=1)  # the controller refused a record: the operator must see it
    assert (first["refused"], first["stragglers_posted"], first["conflicts"]) == (1, 0, 0) and first["accepted"] > 0
    state = run / "goodput-push.json"  # not remembered as posted
    assert not state.exists() or json.loads(state.read_text())["stragglers_posted"] == []
    ctl.api.post("/nodes", {"nodes": [{"id": "n3", "rack": "r01"}], "state": "ready"})
    second = push_cli(ctl, run)
    assert (second["refused"], second["stragglers_posted"]) == (0, 1)
    (e,) = [e for e in ctl.api.events("n3", kind="check_failed") if e["attrs"].get("rule") == "straggler"]
    assert e["attrs"]["rank"] == "1" and e["attrs"]["job"] == JOB
    assert push_cli(ctl, run)["stragglers_posted"] == 0  # now remembered as posted


def test_with_the_controller_down_a_push_is_dropped_and_the_next_one_delivers_everything(ctl: Controller,
                                                                                         tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run(run, time.time() - 400)
    n = len(run_intervals(min(read_run(run), key=lambda lg: lg.rank)))
    down = GoodputPusher(run, f"http://127.0.0.1:{free_port()}", AGENT_TOKEN, job=JOB, timeout_s=2)
    counts = down.push_once()
    assert (counts.failed_posts, counts.accepted) == (1, 0)
    up = GoodputPusher(run, ctl.url, AGENT_TOKEN, job=JOB)
    up.push_once()
    assert up.counts.accepted == n and up.counts.failed_posts == 0


TRAIN = """
import sys, time
from gpufleet.goodput.durable import RunRecorder
rec = RunRecorder(sys.argv[1], rank=0, world=1, host="n1")
for step in range(30):
    with rec.step(step):
        time.sleep(0.01)
    if step % 10 == 9:
        rec.checkpoint_start(step + 1, step + 1, is_async=False)
        rec.checkpoint_end(step + 1)
rec.end()
rec.close()
"""


def test_the_recorder_pushes_from_its_own_process_after_training_exits(ctl: Controller, tmp_path: Path) -> None:
    run = tmp_path / "run"
    env = child_env({"GPUFLEET_CONTROLLER": ctl.url, "GPUFLEET_TOKEN_FILE": str(ctl.token_file),
                     "SLURM_JOB_ID": JOB})
    out = subprocess.run([sys.executable, "-c", TRAIN, str(run)], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    n = len(run_intervals(read_run(run)[0]))
    assert n == 4  # start -> 3 durable snapshots -> end

    def delivered() -> list[dict[str, Any]] | None:
        r = ctl.api.http.get(f"/jobs/{JOB}/goodput")
        return r.json()["intervals"] if r.status_code == 200 and len(r.json()["intervals"]) == n else None

    got = wait_until(delivered, "the recorder's pusher delivering every interval", timeout=60)
    assert sum(i["steps"] for i in got) == 30
    assert [i["start"] for i in got] == sorted(i["start"] for i in got)
