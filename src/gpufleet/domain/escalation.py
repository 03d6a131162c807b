"""Counting "N occurrences within a window" — the arithmetic behind :class:`Escalation`.

Pure functions over timestamps; callers decide what an occurrence is (``diagnose`` counts findings of
one node, the lifecycle policy counts HealthEvents per node). Timestamps may be datetimes or plain
seconds (e.g. seconds since boot from a dmesg log), but one call must not mix the two.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TypeVar

from gpufleet.domain.catalog import Escalation
from gpufleet.domain.errors import InvalidInput

T = TypeVar("T", datetime, float)


def _span(a: T, b: T) -> float:
    if isinstance(a, datetime) and isinstance(b, datetime):
        return (b - a).total_seconds()
    if isinstance(a, datetime) or isinstance(b, datetime):
        raise InvalidInput("times", (a, b), "all datetimes or all seconds, not a mix")
    return float(b) - float(a)


def count_in_window(times: Iterable[T], window: timedelta) -> int:
    """The largest number of ``times`` that fall inside any closed interval of length ``window``.

    ``times`` need not be sorted. An empty input counts 0.
    """
    if window < timedelta(0):
        raise InvalidInput("window", window, "a non-negative duration")
    items = list(times)
    if len({isinstance(t, datetime) for t in items}) > 1:
        raise InvalidInput("times", items[:3], "all datetimes or all seconds, not a mix")
    ordered = sorted(items)
    best = 0
    lo = 0
    limit = window.total_seconds()
    for hi in range(len(ordered)):
        while _span(ordered[lo], ordered[hi]) > limit:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def triggers(times: Sequence[T], count: int, window: timedelta) -> list[int]:
    """Indexes (into ``times``, which must be in non-decreasing order) of the occurrences at which at
    least ``count`` occurrences lie within ``window`` ending at that occurrence.

    With count=2, window=24h and occurrences at 0h, 5h, 40h this returns [1]: the second occurrence
    is the one that escalates; the third is alone in its window.
    """
    if count < 1:
        raise InvalidInput("count", count, "an integer >= 1")
    if window < timedelta(0):
        raise InvalidInput("window", window, "a non-negative duration")
    limit = window.total_seconds()
    recent: deque[T] = deque()
    out: list[int] = []
    for i, t in enumerate(times):
        if recent and _span(recent[-1], t) < 0:
            raise InvalidInput(f"times[{i}]", t, "times in non-decreasing order")
        recent.append(t)
        while _span(recent[0], t) > limit:
            recent.popleft()
        if len(recent) >= count:
            out.append(i)
    return out


def matches(esc: Escalation, kinds: Iterable[str], code: int | None) -> bool:
    """Whether an occurrence known under any of ``kinds`` with ``code`` counts towards ``esc``
    (an escalation without a code counts every code of its kind)."""
    return esc.kind in set(kinds) and (esc.code is None or esc.code == code)
