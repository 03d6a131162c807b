"""Goodput over a time range, per job and for the cluster, from the intervals jobs reported (pure).

An interval that straddles the range counts in proportion to its overlap (its seconds are assumed
spread evenly over it). The cluster's figures weight each job by its world size, so they are
GPU-seconds (rank-seconds): a 1,024-rank job counts 1,024 times a one-rank job. MFU is "in steps"
(:attr:`gpufleet.goodput.intervals.Interval.mfu`), rolled up as ``sum(flops) / sum(step_s * peak)``
over the intervals that declared both; ``None`` where none did.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from gpufleet.domain.errors import InvalidInput
from gpufleet.goodput.ettr import Badput

CATEGORIES = tuple(Badput().as_dict())  # the badput categories, in the report's order


@dataclass(frozen=True, slots=True)
class JobInterval:
    """One stored interval of one job."""

    job: str
    run: str
    start: datetime
    end: datetime
    productive: float
    badput: Badput
    steps: int
    step_s: float
    flops: float | None
    peak_flops: float | None
    world: int

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()


@dataclass(frozen=True, slots=True)
class Goodput:
    """Seconds in a range (per job: wall seconds; for the cluster: rank-seconds) and what they were."""

    elapsed: float
    productive: float
    badput: dict[str, float]
    steps: float
    mfu: float | None

    @property
    def ettr(self) -> float | None:
        return self.productive / self.elapsed if self.elapsed > 0 else None

    def as_dict(self) -> dict[str, object]:
        return {"elapsed_s": self.elapsed, "productive_s": self.productive, "ettr": self.ettr,
                "badput_s": dict(self.badput), "steps": self.steps, "mfu": self.mfu}


@dataclass(frozen=True, slots=True)
class Rollup:
    since: datetime
    until: datetime
    jobs: dict[str, Goodput]
    cluster: Goodput


class _Sum:
    def __init__(self) -> None:
        self.elapsed = self.productive = self.steps = self.flops = self.capacity = 0.0
        self.badput = dict.fromkeys(CATEGORIES, 0.0)

    def add(self, i: JobInterval, share: float, weight: int) -> None:
        w = share * weight
        self.elapsed += i.seconds * w
        self.productive += i.productive * w
        for k, v in i.badput.as_dict().items():
            self.badput[k] += v * w
        self.steps += i.steps * share
        if i.flops is not None and i.peak_flops:
            self.flops += i.flops * w
            self.capacity += i.step_s * i.peak_flops * w

    def done(self) -> Goodput:
        return Goodput(self.elapsed, self.productive, self.badput, self.steps,
                       self.flops / self.capacity if self.capacity > 0 else None)


def overlap(i: JobInterval, since: datetime, until: datetime) -> float:
    """The share of ``i`` inside ``[since, until)`` (0 to 1)."""
    if i.seconds <= 0:
        return 0.0
    lo, hi = max(i.start, since), min(i.end, until)
    return max(0.0, (hi - lo).total_seconds()) / i.seconds


def rollup(intervals: Iterable[JobInterval], since: datetime, until: datetime) -> Rollup:
    """Per job (wall seconds) and for the cluster (rank-seconds) over ``[since, until)``."""
    if until <= since:
        raise InvalidInput("until", until.isoformat(), f"a time after since ({since.isoformat()})")
    jobs: dict[str, _Sum] = {}
    cluster = _Sum()
    for i in intervals:
        share = overlap(i, since, until)
        if share <= 0:
            continue
        jobs.setdefault(i.job, _Sum()).add(i, share, 1)
        cluster.add(i, share, i.world)
    return Rollup(since, until, {j: s.done() for j, s in sorted(jobs.items())}, cluster.done())
