"""The background the coherence statistic tests against, learned from the stream.

``q[(kind, r)]`` is the fraction of class-``r`` components that reported event kind ``kind`` per
coherence window over the last ``rate_window`` (reporters explained by a significant candidate left
out, so a fault in progress does not raise its own background), shrunk towards the cold-start prior
``PRIOR_Q`` with ``PRIOR_WEIGHT`` component-windows; ``q[r]`` sums over kinds. A background witness's
minutes beyond its first (its *excess*) are negative binomial with the mean and variance of those
reporters, shrunk to a Poisson(``PRIOR_EXCESS``) prior worth ``PRIOR_REP_WEIGHT`` reporters (variance
not above the mean: Poisson). :mod:`gpufleet.correlate.coherence` refreshes them once a minute.

The sums are kept as reporters come, repeat and leave (integers: the same as summing them afresh at
each refresh, which is what the code did before, one pass over every reporter of the last two hours
per minute of stream), so a refresh costs the reporters that left plus the few explained ones. The
(time, reporter) entries that find who left go to a queue in time order (a stream is, but for late
events) and the few late ones to a heap: a heap alone cost a sift per entry, about 1 us per event at
131,072 GPUs, for the same entries popped at the same refreshes.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

PRIOR_Q = 0.01  # per component, per kind, per window: a corrected-error report (our assumption)
PRIOR_WEIGHT = 50.0  # component-windows the prior is worth
PRIOR_EXCESS, PRIOR_REP_WEIGHT = 0.5, 20.0


class Reporters:
    """The reporters of one (event kind, class) in the rate window: (last time, minutes, last minute)
    by reporter, the sums the rates need, and the (time, reporter) entries to find who left: a queue
    in time order and a heap for the entries that came out of order (late events)."""

    __slots__ = ("excess", "excess2", "heap", "last", "n", "queue")

    def __init__(self) -> None:
        self.last: dict[str, tuple[float, int, int]] = {}
        self.queue: deque[tuple[float, str]] = deque()  # times not decreasing
        self.heap: list[tuple[float, str]] = []  # the rest
        self.n = self.excess = self.excess2 = 0  # reporters, sum of minutes beyond the first, of squares

    def saw(self, reporter: str, t: float, minute: int, prev: tuple[float, int, int] | None) -> None:
        """``reporter`` spoke at ``t`` in ``minute`` (not its last minute); ``prev``: its entry before
        (kept until a refresh finds it older than the rate window, as before)."""
        if prev is None:
            self.last[reporter] = (t, 1, minute)
            self.n += 1
        else:
            u = prev[1]
            self.last[reporter] = (t, u + 1, minute)
            self.excess += 1
            self.excess2 += 2 * u - 1  # u**2 - (u - 1)**2
        queue = self.queue
        if not queue or t >= queue[-1][0]:
            queue.append((t, reporter))
        else:
            heapq.heappush(self.heap, (t, reporter))

    def forget_before(self, cutoff: float) -> None:
        """Drop the reporters last seen before ``cutoff``. Every current entry has its (time, reporter)
        in the queue or the heap; entries a later minute replaced are skipped when they come up. Every
        entry older than ``cutoff`` is taken out of both (in another order than one heap would, which
        changes nothing: whether a reporter goes depends only on its last time)."""
        queue, heap, last = self.queue, self.heap, self.last
        while queue and queue[0][0] < cutoff:
            self._gone(queue.popleft()[1], last, cutoff)
        while heap and heap[0][0] < cutoff:
            self._gone(heapq.heappop(heap)[1], last, cutoff)

    def _gone(self, r: str, last: dict[str, tuple[float, int, int]], cutoff: float) -> None:
        v = last.get(r)
        if v is not None and v[0] < cutoff:
            del last[r]
            self.n -= 1
            self.excess -= v[1] - 1
            self.excess2 -= (v[1] - 1) ** 2


def learn(seen: dict[tuple[str, str], Reporters], cutoff: float, windows: float, left_out: list[str],
          class_size: dict[str, int]) -> tuple[dict[str, float], tuple[float, float]]:
    """(``q`` per class, (mean excess, negative-binomial size; inf: Poisson)) from the reporters seen
    since ``cutoff`` (``windows`` coherence windows of stream), leaving out ``left_out``. A (kind, class)
    that nobody reported since ``cutoff`` is dropped from ``seen``: a class silent for the whole rate
    window is back at the prior (``PRIOR_Q``, the callers' default for a class with no entry), as it is
    before its first report and after a restart primed with the rate window (decision 0113). Kept, it
    gave the shrunk rate of zero reports (about 0.5 / class size), a rate no restart reproduces."""
    per_class: dict[str, float] = {}
    active = excess = excess2 = 0
    for key in list(seen):
        rs = seen[key]
        rs.forget_before(cutoff)
        if not rs.last:
            del seen[key]
            continue
        cls = key[1]
        n, ex, ex2 = rs.n, rs.excess, rs.excess2
        last = rs.last
        for r in left_out:
            v = last.get(r)
            if v is not None:
                n -= 1
                ex -= v[1] - 1
                ex2 -= (v[1] - 1) ** 2
        active += n
        excess += ex
        excess2 += ex2
        rate = (PRIOR_Q * PRIOR_WEIGHT + n / windows) / (PRIOR_WEIGHT + class_size.get(cls, 1))
        per_class[cls] = per_class.get(cls, 0.0) + rate
    w = PRIOR_REP_WEIGHT
    m = (PRIOR_EXCESS * w + excess) / (w + active)
    var = (PRIOR_EXCESS * (1 + PRIOR_EXCESS) * w + excess2) / (w + active) - m * m
    return per_class, (m, m * m / (var - m) if var > m * 1.001 else math.inf)
