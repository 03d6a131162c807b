"""Straggler / fail-slow detection from per-rank step times (pure).

In a synchronous job every rank's *step* takes as long as the slowest rank's, so the signal is each
rank's own compute time (``RunRecorder.compute()``; the whole step time when a rank did not record it).
The method, after Falcon (Wu et al., "FALCON: Pinpointing and Mitigating Stragglers for Large-Scale
Hybrid-Parallel Training", 2024) and Greyhound (2025), which detect fail-slow with change points on
iteration times:

1. **Peer ratio.** For each step and rank, divide the rank's time by the median of the *other* ranks'
   times at that step. Anything that slows every rank alike (diurnal load, a shared filesystem, a
   longer sequence) cancels; what remains is how this rank compares with its peers.
2. **Change point.** On each rank's log-ratio series find the single split after which the values
   rank highest against those before (the Mann-Whitney rank-sum statistic of the tail, standardised:
   a z-score). Ranks make it robust to the heavy-tailed noise of real step times (one 10x step does
   not move it). A rank that is slow from its first step has no change point; its whole-series
   median ratio names it.
3. **Decision.** A rank is a straggler when its *current* segment (the one that reaches the last step)
   has a median peer ratio >= ``1 + min_slowdown`` over >= ``min_steps`` steps: from the change point
   when there is one (a rank-sum z-score >= ``min_score``, from a normal level), else
   from its first step when its whole series is that slow. A rank that slowed and recovered is not
   named (it is no longer slow).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from datetime import datetime

from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.fleet import gpu_slot

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
    score: float  # the change point's rank-sum z-score (inf when slow from the start)

    def as_dict(self) -> dict[str, object]:
        return {"rank": self.rank, "host": self.host, "local_rank": self.local_rank, "from_step": self.from_step,
                "slowdown": round(self.slowdown, 4), "before": round(self.before, 4), "steps": self.steps,
                "score": None if math.isinf(self.score) else round(self.score, 2)}


def find_stragglers(series: list[RankSeries], *, min_slowdown: float = 0.15, min_steps: int = 10,
                    min_score: float = 4.0) -> tuple[Straggler, ...]:
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
    after = before = 0.0
    if k > 0:
        k = _refine(x, k, min_steps)
        after, before = statistics.median(x[k:]), statistics.median(x[:k])
        if score >= min_score and after < bar:
            return None  # the current level is normal (it recovered, or it was faster)
        if before < bar <= after and (score >= min_score or whole >= bar):
            return k, math.exp(after), math.exp(before), score
    if whole >= bar:
        return 0, math.exp(whole), 1.0, math.inf
    return None


def _change_point(x: list[float], min_steps: int) -> tuple[int, float]:
    """The split where the later values rank highest against the earlier ones (the Mann-Whitney
    rank-sum statistic of the tail, standardised), and that z-score. Ranks, not values: one step that
    took 10x (a page fault, a noisy neighbour) moves a rank sum by at most one place per step."""
    n = len(x)
    order = sorted(range(n), key=lambda i: x[i])
    ranks = [0.0] * n
    for r, i in enumerate(order, start=1):
        ranks[i] = float(r)
    suffix = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        suffix[i] = suffix[i + 1] + ranks[i]
    best_k, best = -1, 0.0
    for k in range(min_steps, n - min_steps + 1):
        m = n - k  # tail length
        expected = m * (n + 1) / 2
        z = (suffix[k] - expected) / math.sqrt(k * m * (n + 1) / 12)
        if z > best:
            best_k, best = k, z
    return best_k, best


def _refine(x: list[float], k: int, min_steps: int) -> int:
    """Place the change point where a step function at the midpoint between the two levels misreads
    the fewest steps; among equals the latest, since step-time noise is one-sided (a step is delayed,
    never early), so a slow-looking step just before the change is more likely noise."""
    tau = (statistics.median(x[:k]) + statistics.median(x[k:])) / 2
    n = len(x)
    above = [0] * (n + 1)  # above[i]: steps before i above tau
    for i, v in enumerate(x):
        above[i + 1] = above[i] + (v > tau)
    best, best_err = k, n + 1
    for j in range(min_steps, n - min_steps + 1):
        err = above[j] + (n - j) - (above[n] - above[j])
        if err <= best_err:
            best, best_err = j, err
    return best


def straggler_event(s: Straggler, *, job: str, time: datetime, run: str = "") -> HealthEvent:
    """The observation for the controller (``POST /v1/events``): ``check_failed`` with ``rule=straggler``
    on the rank's node and GPU (``<host>-gpu<local rank>``). No severity: the catalog judges it."""
    gpu = None if s.local_rank is None else gpu_slot(s.host, s.local_rank)
    attrs = {"rule": RULE, "job": job, "rank": str(s.rank), "from_step": str(s.from_step),
             "slowdown": f"{s.slowdown:.4g}", "before": f"{s.before:.4g}", "steps": str(s.steps),
             "score": "" if math.isinf(s.score) else f"{s.score:.3g}"}
    if run:
        attrs["run"] = run
    return HealthEvent(
        id=f"straggler:{job or run}:{s.rank}:{s.from_step}", node=s.host, kind=EventKind.CHECK_FAILED, time=time,
        component=gpu, message=f"rank {s.rank} of job {job or '-'} is {s.slowdown:.2f}x slower than its peers "
        f"from step {s.from_step} ({s.steps} steps)", source="goodput", attrs=tuple(sorted(attrs.items())))
