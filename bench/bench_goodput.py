"""Recorder overhead: what ``RunRecorder`` adds to one training step, as % of a 100 ms step (10 steps/s).

Per step the loop does what the example does: ``with rec.step(...)`` around ``with rec.compute()`` --
one JSON line written with ``O_APPEND`` -- plus a checkpoint (start, end, persisted with ``fsync``)
every 100 steps. The step body is empty, so the time measured is the recorder's alone. Then
``gpufleet goodput report`` on the file written (read + account), per 10,000 steps.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from gpufleet.goodput.durable import RunRecorder, read_run
from gpufleet.goodput.runreport import run_report

STEP_S = 0.1  # 10 steps/s


def _loop(run: Path, steps: int, fsync: str) -> float:
    rec = RunRecorder(run, rank=0, world=1, fsync=fsync)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    for s in range(steps):
        with rec.step(s, tokens=4096), rec.compute():
            pass
        if s % 100 == 99:
            rec.checkpoint_start(s + 1, s + 1, is_async=True)
            rec.checkpoint_end(s + 1)
            rec.checkpoint_persisted(s + 1, s + 1)
    per_step = (time.perf_counter() - t0) / steps
    rec.end()
    rec.close()
    return per_step


def run(quick: bool) -> dict[str, Any]:
    steps = 2_000 if quick else 20_000
    out: dict[str, Any] = {"steps": steps, "step_s_assumed": STEP_S}
    for fsync in ("checkpoint", "always"):
        per = []
        for _ in range(3):
            with tempfile.TemporaryDirectory() as d:
                per.append(_loop(Path(d), steps, fsync))
        us = statistics.median(per) * 1e6
        pct = 100 * us / (STEP_S * 1e6)
        out[f"fsync_{fsync}"] = {"us_per_step": round(us, 2), "overhead_pct_at_10_steps_s": round(pct, 4),
                                 "goal_pct": 1.0, "met": pct < 1.0}
    with tempfile.TemporaryDirectory() as d:
        _loop(Path(d), steps, "never")
        t0 = time.perf_counter()
        rep = run_report(read_run(d))
        secs = time.perf_counter() - t0
    out["report"] = {"steps_read": rep.steps_run, "s_per_10k_steps": round(secs * 10_000 / steps, 3)}
    return out
