"""One run's goodput report from its per-rank logs (pure): ETTR, MTTF, badput, restarts, MFU, stragglers.

The job's timeline is the lowest rank's (rank 0 in a complete run): every rank sees the same attempts,
and rank 0 is the one that records checkpoint completion. The other ranks add their step times, from
which :mod:`gpufleet.goodput.straggler` names slow ranks.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from gpufleet.domain.errors import InvalidInput
from gpufleet.goodput.ettr import GoodputReport, compute
from gpufleet.goodput.intervals import Interval, run_intervals
from gpufleet.goodput.runlog import RankLog, RecordKind, Restart, job_run
from gpufleet.goodput.straggler import RankSeries, Straggler, find_stragglers
from gpufleet.goodput.tco import Tco

MAX_INTERVAL_LINES = 20  # the text report lists the first intervals; --json has them all


@dataclass(frozen=True, slots=True)
class Mfu:
    """Model FLOPs utilisation. ``training``: FLOPs of the steps run / (their time x peak);
    ``effective``: FLOPs of the steps kept / (elapsed x peak) = what the run achieved end to end.
    ``lost_to_restarts``: FLOPs redone after restarts / (elapsed x peak). ``lost_to_stragglers``: how
    much higher ``training`` would be without the steps' delay since the first straggler appeared
    (each step's time above the median step time before it, :func:`straggler_delay`)."""

    flops_per_step: float
    peak_flops: float
    training: float
    effective: float
    lost_to_restarts: float
    lost_to_stragglers: float = 0.0
    dtype: str = ""  # as the run declared it
    # the GPU's measured GEMM ceiling per GPU (gpufleet.checks.model.measured_gemm_flops), when given
    ceiling_flops: float | None = None

    @property
    def of_ceiling(self) -> float | None:
        """The steps' achieved FLOP/s over the measured ceiling: how close to what this GPU can do."""
        return None if not self.ceiling_flops else self.training * self.peak_flops / self.ceiling_flops


@dataclass(frozen=True, slots=True)
class RunReport:
    goodput: GoodputReport
    ranks: tuple[int, ...]
    world: int
    job: str
    restarts: tuple[Restart, ...]
    steps_run: int  # step lines on the reporting rank (a redone step counts twice)
    steps_kept: int  # distinct step numbers completed
    steps_redone: int
    tokens_kept: int | None
    median_step_s: float | None
    mfu: Mfu | None
    stragglers: tuple[Straggler, ...]
    torn_lines: int
    intervals: tuple[Interval, ...] = ()
    straggler_delay_s: float = 0.0  # step time above the pre-straggler median, from the first straggler on

    def as_dict(self) -> dict[str, Any]:
        g = self.goodput
        return {
            "job": self.job, "world": self.world, "ranks": list(self.ranks),
            "ettr": g.ettr, "elapsed_s": g.elapsed, "productive_s": g.productive, "mttf_s": g.mttf,
            "restarts": len(self.restarts),
            "restart_detail": [{"time": r.time, "reached_step": r.reached, "resumed_step": r.resumed,
                                "steps_redone": r.steps_redone, "inferred_from_repeated_step": r.inferred}
                               for r in self.restarts],
            "interruptions": {"total": g.interruptions.total, "unexpected": g.interruptions.unexpected,
                              "planned": g.interruptions.planned, "by_cause": dict(g.interruptions.by_cause)},
            "badput_s": g.badput.as_dict(),
            "checkpoints_durable": g.checkpoints,
            "steps": {"run": self.steps_run, "kept": self.steps_kept, "redone": self.steps_redone,
                      "median_s": self.median_step_s},
            "tokens_kept": self.tokens_kept,
            "mfu": None if self.mfu is None else {
                "flops_per_step": self.mfu.flops_per_step, "peak_flops": self.mfu.peak_flops,
                "training": self.mfu.training, "effective": self.mfu.effective,
                "lost_to_restarts": self.mfu.lost_to_restarts, "lost_to_stragglers": self.mfu.lost_to_stragglers,
                "dtype": self.mfu.dtype, "ceiling_flops": self.mfu.ceiling_flops, "of_ceiling": self.mfu.of_ceiling},
            "straggler_delay_s": self.straggler_delay_s,
            "intervals": [{"start": i.start, "end": i.end, "productive_s": i.productive, "steps": i.steps,
                           "step_s": i.step_s, "mfu": i.mfu,
                           "badput_s": {k: v for k, v in i.badput.as_dict().items() if v}} for i in self.intervals],
            "stragglers": [s.as_dict() for s in self.stragglers],
            "torn_lines": self.torn_lines, "ignored_events": g.ignored_events,
        }


def run_report(logs: list[RankLog]) -> RunReport:
    if not logs:
        raise InvalidInput("run", "no rank logs", "at least one goodput-rank<R>.jsonl")
    logs = sorted(logs, key=lambda lg: lg.rank)
    lead = logs[0]
    run = job_run(lead)
    report = compute(run.timeline)
    steps = [r for a in lead.attempts for r in a.records if r.ev is RecordKind.STEP and r.step is not None]
    last_exec = {r.step: r for r in steps}  # the execution of each step that counted
    tokens = [r.tokens for r in last_exec.values()]
    durs = [r.dur for r in steps if r.dur is not None]
    redone = sum(r.steps_redone for r in run.restarts)
    att = lead.attempts[-1]
    mfu = None
    fps = next((a.flops_per_step for a in reversed(lead.attempts) if a.flops_per_step), None)
    peak = next((a.peak_flops for a in reversed(lead.attempts) if a.peak_flops), None)
    series = [RankSeries(lg.rank, lg.host, lg.attempts[-1].local_rank,
                         tuple((r.step, r.compute if r.compute is not None else r.dur or 0.0)
                               for a in lg.attempts for r in a.records
                               if r.ev is RecordKind.STEP and r.step is not None))
              for lg in logs]
    stragglers = find_stragglers(series)
    delay = straggler_delay([(r.step, r.dur or 0.0) for r in steps if r.step is not None],
                            min((st.from_step for st in stragglers), default=None))
    if fps and peak and report.elapsed > 0 and durs:
        training = fps * len(durs) / (sum(durs) * peak)
        without = fps * len(durs) / ((sum(durs) - delay) * peak) if sum(durs) > delay else training
        mfu = Mfu(fps, peak, training=training, effective=fps * len(last_exec) / (report.elapsed * peak),
                  lost_to_restarts=fps * redone / (report.elapsed * peak), lost_to_stragglers=without - training,
                  dtype=next((a.dtype for a in reversed(lead.attempts) if a.dtype), ""))
    return RunReport(
        goodput=report, ranks=tuple(lg.rank for lg in logs), world=att.world, job=att.job,
        restarts=run.restarts, steps_run=len(steps), steps_kept=len(last_exec), steps_redone=redone,
        tokens_kept=sum(t for t in tokens if t is not None) if any(t is not None for t in tokens) else None,
        median_step_s=statistics.median(durs) if durs else None, mfu=mfu,
        stragglers=stragglers, torn_lines=sum(lg.torn_lines for lg in logs), intervals=run_intervals(lead),
        straggler_delay_s=delay)


def straggler_delay(steps: list[tuple[int, float]], from_step: int | None) -> float:
    """Seconds the steps from ``from_step`` on took beyond the median step time before it: in a
    synchronous job every rank waits for the slowest, so this is the time the stragglers cost. 0 without
    a straggler or without steps before it to compare with."""
    if from_step is None:
        return 0.0
    before = [d for s, d in steps if s < from_step and d > 0]
    if not before:
        return 0.0
    base = statistics.median(before)
    return sum(max(0.0, d - base) for s, d in steps if s >= from_step)


def render_text(r: RunReport, cost: Tco | None = None) -> str:
    g = r.goodput
    out = [f"job {r.job or '-'}: {len(r.ranks)} of {r.world} rank logs",
           f"ETTR          {100 * g.ettr:.2f} %  ({g.productive:.1f} s productive of {g.elapsed:.1f} s)",
           f"MTTF          {'-' if g.mttf is None else f'{g.mttf:.1f} s'}",
           f"restarts      {len(r.restarts)}  (steps redone: {r.steps_redone})",
           f"steps         {r.steps_kept} kept, {r.steps_run} run"
           + ("" if r.median_step_s is None else f", median {1000 * r.median_step_s:.1f} ms"),
           f"checkpoints   {g.checkpoints} durable"]
    if r.mfu is not None:
        out.append(f"MFU           {100 * r.mfu.training:.1f} % in steps, {100 * r.mfu.effective:.1f} % "
                   f"end to end ({100 * r.mfu.lost_to_restarts:.2f} % redone after restarts, "
                   f"{100 * r.mfu.lost_to_stragglers:.2f} % lost to stragglers)")
        if r.mfu.of_ceiling is not None and r.mfu.ceiling_flops:
            out.append(f"              {100 * r.mfu.of_ceiling:.1f} % of this GPU's measured GEMM ceiling "
                       f"({r.mfu.ceiling_flops / 1e12:.4g} TFLOP/s; the datasheet peak is "
                       f"{r.mfu.peak_flops / 1e12:.4g})")
    out.append("badput")
    for k, v in g.badput.as_dict().items():
        if v:
            out.append(f"  {k:<20} {v:9.2f} s  {100 * v / g.elapsed if g.elapsed else 0:6.2f} %")
    for s in r.stragglers:
        out.append(f"straggler     rank {s.rank} on {s.host or '?'} (local rank {s.local_rank}): "
                   f"{s.slowdown:.2f}x its peers from step {s.from_step}")
    if r.straggler_delay_s:
        out.append(f"straggler delay {r.straggler_delay_s:.2f} s of step time above the median before the first")
    shown = [i for i in r.intervals if i.mfu is not None]
    if shown:
        t0 = r.intervals[0].start
        out.append("MFU by interval (between settled points: restarts, durable checkpoints, end)")
        for i in shown[:MAX_INTERVAL_LINES]:
            out.append(f"  {i.start - t0:9.1f} s - {i.end - t0:9.1f} s  {i.steps:6d} steps  "
                       f"MFU {100 * (i.mfu or 0):5.1f} %")
        if len(shown) > MAX_INTERVAL_LINES:
            out.append(f"  ... {len(shown) - MAX_INTERVAL_LINES} more (--json lists every interval)")
    if cost is not None:
        useful = "-" if cost.per_useful_gpu_hour is None else f"{cost.per_useful_gpu_hour:.2f}"
        productive = cost.as_dict()["per_productive_gpu_hour"]
        out.append(f"TCO           {cost.gpu_hours:.2f} GPU-h at {cost.price_per_gpu_hour:g} = {cost.cost:.2f}; "
                   f"badput {cost.badput_cost:.2f}; per productive GPU-h "
                   f"{'-' if productive is None else f'{productive:.2f}'}, per useful GPU-h (at peak) {useful}")
    if r.torn_lines:
        out.append(f"torn lines    {r.torn_lines} (a crash cut a record short; skipped)")
    return "\n".join(out)
