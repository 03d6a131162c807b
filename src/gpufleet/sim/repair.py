"""Repair-time models: how long a drained node is away before it can serve again.

The default is the empirical distribution of the 368 job-interrupting faults' recorded repair times
in StepFun's InfiniteHBD trace (``data/infinitehbd_repair_days.csv``; median 0.67 d, mean 4.0 d, 90th
percentile 8.7 d, max 131 d). It is heavy-tailed: an exponential with the same mean puts the median
at 2.8 d and lies 0.36 from the data in Kolmogorov-Smirnov distance (a "2-day exponential" guess:
0.32; a log-normal fit: 0.09), so it misstates both the typical and the worst repairs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Protocol

from gpufleet.domain.errors import InvalidInput
from gpufleet.sim.trace import DAY, Effect, FaultTrace


class RepairModel(Protocol):
    @property
    def name(self) -> str: ...

    def sample(self, rng: random.Random) -> float:
        """One repair time in seconds."""
        ...


@dataclass(frozen=True, slots=True)
class FixedRepair:
    seconds: float
    name: str = "fixed"

    def sample(self, rng: random.Random) -> float:
        return self.seconds


@dataclass(frozen=True, slots=True)
class ExponentialRepair:
    mean: float  # seconds
    name: str = "exponential"

    def sample(self, rng: random.Random) -> float:
        return rng.expovariate(1.0 / self.mean) if self.mean > 0 else 0.0


@dataclass(frozen=True, slots=True)
class EmpiricalRepair:
    """Resamples recorded repair times (seconds)."""

    values: tuple[float, ...]
    name: str = "empirical"

    def __post_init__(self) -> None:
        if not self.values or any(not (v >= 0 and math.isfinite(v)) for v in self.values):
            raise InvalidInput("repair_times", len(self.values), "at least one finite repair time >= 0")

    def sample(self, rng: random.Random) -> float:
        return self.values[int(rng.random() * len(self.values))]

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)


def trace_repairs(trace: FaultTrace, effect: Effect = Effect.INTERRUPT) -> EmpiricalRepair:
    return EmpiricalRepair(tuple(d * DAY for d in trace.repair_days(effect)), name="trace")


def default_repair() -> EmpiricalRepair:
    """The shipped InfiniteHBD repair-time distribution."""
    text = (resources.files("gpufleet.sim") / "data" / "infinitehbd_repair_days.csv").read_text(encoding="utf-8")
    rows = [ln for ln in text.splitlines() if ln and not ln.startswith("#")][1:]
    return EmpiricalRepair(tuple(float(r) * DAY for r in rows), name="infinitehbd")


def write_repair_csv(trace: FaultTrace, path: Path) -> None:
    """Write ``trace``'s job-interrupting repair times in the shipped CSV format."""
    lines = ["repair_days", *(f"{d:.4f}" for d in trace.repair_days())]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def ks_distance(sample: Sequence[float], cdf: Callable[[float], float]) -> float:
    """Kolmogorov-Smirnov distance between a sample and a model CDF (on seconds)."""
    xs = sorted(sample)
    n = len(xs)
    d = 0.0
    for i, x in enumerate(xs):
        f = cdf(x)
        d = max(d, abs(f - i / n), abs((i + 1) / n - f))
    return d


def exponential_cdf(mean: float) -> Callable[[float], float]:
    return lambda x: 1.0 - math.exp(-x / mean) if mean > 0 else 1.0
