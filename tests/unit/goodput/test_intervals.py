"""A run's final intervals: hand-checked cuts, and the property the idempotent push rests on (a longer log
only appends intervals; it never changes one already produced)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.goodput.durable import RunRecorder, rank_file
from gpufleet.goodput.ettr import compute
from gpufleet.goodput.intervals import run_intervals
from gpufleet.goodput.runlog import job_run, parse_rank_log


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _rec(run: Path, c: Clock) -> RunRecorder:
    return RunRecorder(run, rank=0, world=2, launched=c.t, monotonic=c, wall=c, fsync="never")


def _run(run: Path) -> None:
    """Start 1000, 5 s start-up, steps 0-9 of 1 s, an async checkpoint of step 5 (0.5 s stall) durable
    during step 6, one of step 9 (0.5 s stall) never durable, killed after step 9; back 10 s later:
    3 s start-up, 1 s restore, steps 5-11, end."""
    c = Clock(1000.0)
    r = _rec(run, c)
    r.model(2e12, peak_flops=1e13)
    c.t += 5
    for s in range(10):
        with r.step(s):
            c.t += 1
        if s == 4:
            r.checkpoint_start(5, 5, is_async=True)
            c.t += 0.5
            r.checkpoint_end(5)
        if s == 6:
            r.checkpoint_persisted(5, 5)
        if s == 8:  # a second checkpoint that never becomes durable: no cut there
            r.checkpoint_start(9, 9, is_async=True)
            c.t += 0.5
            r.checkpoint_end(9)
    r.close()
    c.t += 10
    r = _rec(run, c)
    r.model(2e12, peak_flops=1e13)
    c.t += 3
    r.restore_start()
    c.t += 1
    r.restore_end(5)
    for s in range(5, 12):
        with r.step(s):
            c.t += 1
    r.end()
    r.close()


def test_intervals_are_cut_at_starts_durable_snapshots_and_the_end(tmp_path: Path) -> None:
    _run(tmp_path)
    iv = run_intervals(parse_rank_log(rank_file(tmp_path, 0).read_text()))
    assert [(i.start, i.end) for i in iv] == [(1000, 1010), (1010, 1026), (1026, 1037)]
    assert [i.productive for i in iv] == [5, 0, 7]
    assert iv[0].badput.startup == 5
    assert (iv[1].badput.checkpoint_save, iv[1].badput.lost_progress, iv[1].badput.waiting) == (1, 5, 10)
    assert (iv[2].badput.startup, iv[2].badput.checkpoint_restore) == (3, 1)
    assert [i.steps for i in iv] == [5, 5, 7]
    assert [i.world for i in iv] == [2, 2, 2]
    assert iv[2].mfu == pytest.approx(2e12 * 7 / (7 * 1e13))  # 1 s steps of 2 TFLOP at a 10 TFLOP/s peak
    for i in iv:  # every second of an interval is counted once
        assert i.productive + i.badput.total == pytest.approx(i.end - i.start)


def test_the_intervals_add_up_to_the_run_report(tmp_path: Path) -> None:
    _run(tmp_path)
    lead = parse_rank_log(rank_file(tmp_path, 0).read_text())
    iv, report = run_intervals(lead), compute(job_run(lead).timeline)
    assert sum(i.productive for i in iv) == pytest.approx(report.productive)
    for k, v in report.badput.as_dict().items():
        assert sum(i.badput.as_dict()[k] for i in iv) == pytest.approx(v), k


def test_a_longer_log_only_appends_intervals(tmp_path: Path) -> None:
    _run(tmp_path)
    lines = rank_file(tmp_path, 0).read_text().splitlines(keepends=True)
    full = run_intervals(parse_rank_log("".join(lines)))
    seen = set()
    for n in range(1, len(lines) + 1):
        part = run_intervals(parse_rank_log("".join(lines[:n])))
        assert part == full[:len(part)], f"prefix of {n} lines"
        seen.add(len(part))
    assert seen == {0, 1, 2, 3}  # the cuts appear one by one as the log grows
