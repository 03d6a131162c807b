"""A run's goodput as final intervals (pure): what the training side reports to the controller.

The run's timeline (the lowest rank's log, :func:`gpufleet.goodput.runlog.job_run`) is cut at its
*settled* points (:func:`gpufleet.goodput.ettr.settled`): each (re)start, the snapshot of each checkpoint
that became durable, and the end. Between two settled points nothing later can change how a second is
counted, so an interval is final the moment it exists: the same log prefix always yields the same
intervals, a longer log only appends. That is what makes the push idempotent (an interval is keyed by
its job, run and start) without the training side keeping any state: the run directory is the spool.

Each interval carries its productive seconds and badput seconds by category (they add up to its
length), the steps completed in it, their summed duration and, when the run declared its model
(``RunRecorder.model``), their FLOPs and the peak FLOP/s, so MFU can be rolled up over any range:
``sum(flops) / sum(step_s * peak_flops)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from gpufleet.goodput.ettr import Badput, settled
from gpufleet.goodput.runlog import RankLog, RecordKind, job_run


@dataclass(frozen=True, slots=True)
class Interval:
    start: float  # Unix seconds
    end: float
    productive: float  # seconds
    badput: Badput
    steps: int  # steps completed in (start, end] on the reporting rank (a redone step counts again)
    step_s: float  # their summed duration
    flops: float | None  # their model FLOPs (per rank), when declared
    peak_flops: float | None  # per rank
    world: int

    @property
    def mfu(self) -> float | None:
        """FLOPs of the steps over (their time x peak): MFU *in steps* for this interval."""
        if self.flops is None or not self.peak_flops or self.step_s <= 0:
            return None
        return self.flops / (self.step_s * self.peak_flops)


def run_intervals(lead: RankLog) -> tuple[Interval, ...]:
    """The final intervals of the run whose reporting rank's log is ``lead`` (oldest first)."""
    points = settled(job_run(lead).timeline)
    steps = [(r.t, r.dur or 0.0, a.flops_per_step, a.peak_flops, a.world)
             for a in lead.attempts for r in a.records if r.ev is RecordKind.STEP]
    steps.sort(key=lambda s: s[0])
    out: list[Interval] = []
    i = 0
    for prev, cur in pairwise(points):
        while i < len(steps) and steps[i][0] <= prev.time:
            i += 1
        n, dur, flops, peak, world = 0, 0.0, 0.0, None, lead.attempts[-1].world
        declared = True
        while i < len(steps) and steps[i][0] <= cur.time:
            _, d, fps, pk, world = steps[i]
            n, dur = n + 1, dur + d
            if fps is None:
                declared = False
            else:
                flops += fps
            peak = pk if pk is not None else peak
            i += 1
        b0, b1 = prev.badput.as_dict(), cur.badput.as_dict()
        out.append(Interval(prev.time, cur.time, max(0.0, cur.productive - prev.productive),
                            Badput(**{k: max(0.0, b1[k] - b0[k]) for k in b1}), n, dur,
                            flops if n and declared else None, peak, world))
    return tuple(i for i in out if i.end > i.start)
