"""MFU per interval and MFU lost to stragglers in the run report (hand-checked)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.goodput.durable import RunRecorder, read_run
from gpufleet.goodput.runreport import render_text, run_report


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _slowed_run(run: Path) -> None:
    """Two ranks, 60 steps; 2 TFLOP per step at a 10 TFLOP/s peak. Steps take 1 s until rank 1's compute
    slows from 0.5 s to 1.0 s at step 30: every step then takes 1.5 s (the job waits for it). A synchronous
    checkpoint (0.25 s) after every 10 steps."""
    for rank in (0, 1):
        c = Clock(1000.0)
        rec = RunRecorder(run, rank=rank, world=2, launched=c.t, monotonic=c, wall=c, fsync="never", push=False,
                          host=f"n{rank}")
        rec.model(2e12, peak_flops=1e13)
        c.t += 2
        for step in range(60):
            slow = step >= 30
            with rec.step(step):
                with rec.compute():
                    c.t += 1.0 if rank == 1 and slow else 0.5
                c.t += 0.5  # the collective and the optimizer step
                if rank == 0 and slow:
                    c.t += 0.5  # rank 0 waits for rank 1 in the collective
            if step % 10 == 9:
                rec.checkpoint_start(step + 1, step + 1, is_async=False)
                c.t += 0.25
                rec.checkpoint_end(step + 1)
        rec.end()
        rec.close()


def test_mfu_per_interval_and_the_mfu_the_straggler_cost(tmp_path: Path) -> None:
    _slowed_run(tmp_path)
    r = run_report(read_run(tmp_path))
    assert [s.rank for s in r.stragglers] == [1] and r.stragglers[0].from_step == 30
    assert r.straggler_delay_s == pytest.approx(30 * 0.5)
    assert r.mfu is not None
    assert r.mfu.training == pytest.approx(2e12 * 60 / (75 * 1e13))  # 60 steps in 30 s + 45 s
    assert r.mfu.lost_to_stragglers == pytest.approx(2e12 * 60 / (60 * 1e13) - 2e12 * 60 / (75 * 1e13))
    mfus = [i.mfu for i in r.intervals if i.steps]
    assert mfus == [pytest.approx(0.2)] * 3 + [pytest.approx(0.2 / 1.5)] * 3
    doc = json.loads(json.dumps(r.as_dict()))
    assert [i["mfu"] for i in doc["intervals"] if i["steps"]] == mfus
    assert doc["mfu"]["lost_to_stragglers"] == pytest.approx(r.mfu.lost_to_stragglers)
    text = render_text(r)
    assert "lost to stragglers" in text and "MFU by interval" in text and " 13.3 %" in text


def test_without_a_straggler_nothing_is_lost_to_one(tmp_path: Path) -> None:
    c = Clock(0.0)
    for rank in (0, 1):
        c.t = 0.0
        rec = RunRecorder(tmp_path, rank=rank, world=2, launched=0.0, monotonic=c, wall=c, fsync="never", push=False)
        rec.model(1e12, peak_flops=1e13)
        for step in range(40):
            with rec.step(step), rec.compute():
                c.t += 1.0 + 0.5 * (step >= 20)  # everyone slows alike (e.g. a shared filesystem): no straggler
        rec.end()
        rec.close()
    r = run_report(read_run(tmp_path))
    assert r.stragglers == () and r.straggler_delay_s == 0
    assert r.mfu is not None and r.mfu.lost_to_stragglers == 0
