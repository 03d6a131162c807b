"""Straggler / fail-slow detection from per-rank step times (pure).

In a synchronous job every rank's *step* takes as long as the slowest rank's, so the signal is each
rank's own compute time (``RunRecorder.compute()``; the whole step time when a rank did not record it).
The method, after Falcon (Wu et al., "FALCON: Pinpointing and Mitigating Stragglers for Large-Scale
Hybrid-Parallel Training", 2024) and Greyhound (2025), which detect fail-slow with change points on
iteration times:

1. **Peer ratio.** For each step and rank, divide the rank's time by the median of the *other* ranks'
   times at that step. Anything that slows every rank alike (diurnal load, a shared filesystem, a
   longer sequence) cancels; what remains is how this rank compares with its peers.
2. **Change point.** On each rank's log-ratio series find the single split that best separates a
   before and an after level (the CUSUM / two-segment mean-shift statistic, scaled by a robust noise
   estimate: the median absolute deviation of successive differences). A rank that is slow from its
   first step has no change point; its whole-series median ratio names it.
3. **Decision.** A rank is a straggler when its *current* segment (the one that reaches the last step)
   has a median peer ratio >= ``1 + min_slowdown`` over >= ``min_steps`` steps: from the change point
   when there is one (a shift of >= ``min_score`` noise standard errors from a normal level), else
   from its first step when its whole series is that slow. A rank that slowed and recovered is not
   named (it is no longer slow).
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass
from datetime import datetime

from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent

RULE = "straggler"


@dataclass(frozen=True, slots=True)
class RankSeries:
    rank: int
    host: str
    local_rank: int | None
    points: tuple[tuple[int, float], ...]  # (step, seconds); a repeated step keeps its last value


@dataclass(frozen=True, slots=True)
class Straggler:
    rank: int
    host: str
    local_rank: int | None
    from_step: int
    slowdown: float  # median time / peers' median, from ``from_step`` on
    before: float  # the same ratio before ``from_step`` (1.0 when slow from the start)
    steps: int  # steps in the slow segment
    score: float  # shift in robust noise standard errors (inf when slow from the start)

    def as_dict(self) -> dict[str, object]:
        return {"rank": self.rank, "host": self.host, "local_rank": self.local_rank, "from_step": self.from_step,
                "slowdown": round(self.slowdown, 4), "before": round(self.before, 4), "steps": self.steps,
                "score": None if math.isinf(self.score) else round(self.score, 2)}


def find_stragglers(series: list[RankSeries], *, min_slowdown: float = 0.15, min_steps: int = 10,
                    min_score: float = 6.0) -> tuple[Straggler, ...]:
    """The slow ranks, slowest first (needs >= 2 ranks with common steps)."""
    if min_slowdown <= 0:
        raise InvalidInput("min_slowdown", min_slowdown, "a fraction > 0 (0.15 = 15 % slower than peers)")
    if min_steps < 2:
        raise InvalidInput("min_steps", min_steps, "an integer >= 2")
    by_rank = {s.rank: dict(s.points) for s in series}
    if len(by_rank) < 2:
        return ()
    common = sorted(set.intersection(*(set(p) for p in by_rank.values())))
    found = []
    for s in series:
        mine = by_rank[s.rank]
        xs = []
        for step in common:
            peers = statistics.median(p[step] for r, p in by_rank.items() if r != s.rank)
            if peers > 0 and mine[step] > 0:
                xs.append((step, math.log(mine[step] / peers)))
        hit = _judge([x for _, x in xs], min_slowdown, min_steps, min_score)
        if hit is not None:
            k, after, before, score = hit
            found.append(Straggler(s.rank, s.host, s.local_rank, xs[k][0], after, before, len(xs) - k, score))
    return tuple(sorted(found, key=lambda f: -f.slowdown))


def _judge(x: list[float], min_slowdown: float, min_steps: int,
           min_score: float) -> tuple[int, float, float, float] | None:
    n = len(x)
    if n < min_steps:
        return None
    bar = math.log1p(min_slowdown)
    whole = statistics.median(x)
    k, score = _change_point(x, min_steps) if n >= 2 * min_steps else (-1, 0.0)
    if k > 0 and score >= min_score:
        after, before = statistics.median(x[k:]), statistics.median(x[:k])
        if after < bar:
            return None  # the current level is normal (it recovered, or it was faster)
        if before < bar:
            return k, math.exp(after), math.exp(before), score
    if whole >= bar:
        return 0, math.exp(whole), 1.0, math.inf
    return None


def _change_point(x: list[float], min_steps: int) -> tuple[int, float]:
    """The split that best separates two levels of ``x`` and its shift in robust standard errors."""
    n = len(x)
    diffs = [abs(b - a) for a, b in itertools.pairwise(x)]
    sigma = max(statistics.median(diffs) / (0.6745 * math.sqrt(2)), 1e-3)  # robust noise per step
    prefix = [0.0]
    for v in x:
        prefix.append(prefix[-1] + v)
    best_k, best = -1, 0.0
    for k in range(min_steps, n - min_steps + 1):
        shift = (prefix[n] - prefix[k]) / (n - k) - prefix[k] / k
        z = abs(shift) / sigma * math.sqrt(k * (n - k) / n)
        if z > best:
            best_k, best = k, z
    return best_k, best


def straggler_event(s: Straggler, *, job: str, time: datetime, run: str = "") -> HealthEvent:
    """The observation for the controller (``POST /v1/events``): ``check_failed`` with ``rule=straggler``
    on the rank's node and GPU (``<host>-gpu<local rank>``). No severity: the catalog judges it."""
    gpu = None if s.local_rank is None else f"{s.host}-gpu{s.local_rank}"
    attrs = {"rule": RULE, "job": job, "rank": str(s.rank), "from_step": str(s.from_step),
             "slowdown": f"{s.slowdown:.4g}", "before": f"{s.before:.4g}", "steps": str(s.steps),
             "score": "" if math.isinf(s.score) else f"{s.score:.3g}"}
    if run:
        attrs["run"] = run
    return HealthEvent(
        id=f"straggler:{job or run}:{s.rank}:{s.from_step}", node=s.host, kind=EventKind.CHECK_FAILED, time=time,
        component=gpu, message=f"rank {s.rank} of job {job or '-'} is {s.slowdown:.2f}x slower than its peers "
        f"from step {s.from_step} ({s.steps} steps)", source="goodput", attrs=tuple(sorted(attrs.items())))
