"""The tiny GPT example under torchrun (2 ranks, gloo): killed mid-run, restarted, reported.

Ground truth comes from the wall clock, independently of the recorder: the harness's own launch times,
and rank 0's per-iteration ``time.time()`` lines (``--truth``). The productive time is the wall time of
the iterations whose result survived (the last execution of each step), less the checkpoint stalls.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import require_service

pytestmark = pytest.mark.goodput

ROOT = Path(__file__).resolve().parents[3]
STEPS, EVERY, CRASH_AT = 70, 10, 34
SLOW_RANK, SLOW_FROM = 1, 25


def _torchrun() -> Path:
    return Path(sys.executable).with_name("torchrun")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(run_dir: Path, out: Path, *extra: str) -> tuple[subprocess.Popen[bytes], float]:
    launched = time.time()
    env = {**os.environ, "GPUFLEET_LAUNCH_TIME": repr(launched), "PYTHONPATH": str(ROOT / "src"),
           "OMP_NUM_THREADS": "1"}
    env.pop("GPUFLEET_CONTROLLER", None)
    cmd = [str(_torchrun()), "--nproc-per-node", "2", "--master-port", str(_free_port()),
           str(ROOT / "examples/tiny_gpt/train.py"), "--run-dir", str(run_dir), "--steps", str(STEPS),
           "--ckpt-every", str(EVERY), "--truth", "--slow-rank", str(SLOW_RANK), "--slow-from", str(SLOW_FROM),
           "--slow-factor", "3.0", *extra]
    with out.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc, launched


def _truth(out: Path) -> list[dict[str, float]]:
    rows = []
    for line in out.read_text(errors="replace").splitlines():
        if line.startswith('{"truth"'):
            rows.append(json.loads(line))
    return rows


def _complete(ckpt: Path) -> list[int]:
    return sorted(int(d.name.split("-")[1]) for d in ckpt.glob("step-*") if (d / ".metadata").is_file())


def test_killed_run_resumes_and_the_report_matches_the_wall_clock(tmp_path: Path) -> None:
    require_service(_torchrun().exists(), "torch (torchrun) in the test environment")
    run, out1, out2 = tmp_path / "run", tmp_path / "run1.out", tmp_path / "run2.out"
    proc, launch1 = _launch(run, out1, "--crash-at", str(CRASH_AT))  # every rank SIGKILLs itself mid-step
    assert proc.wait(timeout=300) != 0, out1.read_text()[-3000:]
    resume = max(_complete(run / "ckpt"))
    first = _truth(out1)

    proc2, _ = _launch(run, out2)
    assert proc2.wait(timeout=300) == 0, out2.read_text()[-3000:]
    second = _truth(out2)

    # resumed from the last complete checkpoint; only the steps after it ran twice, each once more
    run1 = [r["step"] for r in first if r["truth"] == "step"]
    run2 = [r["step"] for r in second if r["truth"] == "step"]
    assert run2[0] == resume
    assert sorted(set(run1) | set(run2)) == list(range(STEPS))
    assert sorted(set(run1) & set(run2)) == list(range(resume, max(run1) + 1))
    assert len(run2) == len(set(run2)) and len(run1) == len(set(run1))

    # An iteration's wall time runs from its start to the next one's start (the last: to the loop's end),
    # so whatever the loop does between two steps (the truth line itself) is in it, as it is for the
    # recorder; less its checkpoint stall. The later run's execution of a step wins.
    kept: dict[int, float] = {}
    for rows in (first, second):
        starts = [(int(r["step"]), r["begin"], r["stall"]) for r in rows if r["truth"] == "step"]
        ends = [b for _, b, _ in starts[1:]] + [next((r["time"] for r in rows if r["truth"] == "loop_end"), 0.0)]
        for (step, begin, stall), until in zip(starts, ends, strict=True):
            kept[step] = until - begin - stall
    assert all(v > 0 for v in kept.values()), kept  # (run 1's last step, redone, has no loop end)
    productive = sum(kept.values())
    end = next(r["time"] for r in second if r["truth"] == "end")
    truth_ettr = productive / (end - launch1)


    rep = subprocess.run([sys.executable, "-m", "gpufleet.cli", "goodput", "report", str(run), "--json"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                         check=True)
    doc = json.loads(rep.stdout)
    assert abs(doc["ettr"] - truth_ettr) <= 0.01 * truth_ettr, (doc["ettr"], truth_ettr, doc)
    assert doc["restarts"] == 1
    assert doc["steps"]["redone"] == len(set(run1) & set(run2))
    assert doc["restart_detail"][0]["resumed_step"] == resume
    # the slow rank is named; where it began is checked in the unit tests: on an oversubscribed 2-core
    # box the peer ratio itself swings 0.3x-20x, so the change point is not placed reliably here
    slow = [s["rank"] for s in doc["stragglers"]]
    assert slow == [SLOW_RANK], doc["stragglers"]
    assert doc["stragglers"][0]["from_step"] <= SLOW_FROM + 30
