"""Slurm host lists: ``n[1-3,7],gpu[008-010],login`` <-> individual names.

``squeue --json`` reports a job's nodes as one host-list expression; the adapter needs the names
(:func:`expand`), and the files gpufleet writes for Slurm (topology.conf) list many names in one
(:func:`compress`). Zero padding is kept (``gpu[008-010]`` -> ``gpu008, gpu009, gpu010``). Only one
bracket group per name is supported, which is what Slurm itself prints for flat node names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from gpufleet.domain.errors import InvalidInput

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")


def _split_top(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise InvalidInput("hostlist", expr, "balanced brackets, e.g. n[1-3]")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise InvalidInput("hostlist", expr, "balanced brackets, e.g. n[1-3]")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def expand(expr: str | None) -> tuple[str, ...]:
    """Every host named by a Slurm host-list expression, in order, without duplicates."""
    if not expr or expr in ("(null)", "None"):
        return ()
    out: list[str] = []
    for part in _split_top(expr):
        if "[" not in part:
            out.append(part)
            continue
        head, _, rest = part.partition("[")
        body, _, tail = rest.partition("]")
        if "[" in tail or "]" in tail:
            raise InvalidInput("hostlist", expr, "one bracket group per name, e.g. n[1-3]")
        for item in body.split(","):
            m = _RANGE.match(item.strip())
            if not m:
                raise InvalidInput("hostlist", expr, "numeric ranges in brackets, e.g. n[1-3,7]")
            lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
            lo, hi = int(lo_s), int(hi_s)
            if hi < lo:
                raise InvalidInput("hostlist", expr, "ranges written low-high, e.g. n[1-3]")
            width = len(lo_s) if lo_s.startswith("0") else 0
            out.extend(f"{head}{i:0{width}d}{tail}" for i in range(lo, hi + 1))
    return tuple(dict.fromkeys(out))


def compress(names: Iterable[str]) -> str:
    """One host-list expression for ``names`` (duplicates dropped): the trailing numbers of names that
    share a prefix and a digit count become ranges (``r01-n01 r01-n02 r01-n03`` -> ``r01-n[01-03]``).
    :func:`expand` of the result gives the same set of names."""
    groups: dict[tuple[str, int], set[int]] = {}
    plain: set[str] = set()
    for name in names:
        if not name or any(c in name for c in ",[] \t\n"):
            raise InvalidInput("hostlist name", name, "a host name without commas, brackets or spaces")
        m = _TRAILING_NUMBER.match(name)
        if m is None:
            plain.add(name)
        else:
            groups.setdefault((m.group(1), len(m.group(2))), set()).add(int(m.group(2)))
    parts = sorted(plain)
    for (prefix, digits), numbers in sorted(groups.items()):
        ranges: list[str] = []
        for lo, hi in _runs(sorted(numbers)):
            text = f"{lo:0{digits}d}" if lo == hi else f"{lo:0{digits}d}-{hi:0{digits}d}"
            ranges.append(text)
        parts.append(f"{prefix}{ranges[0]}" if len(numbers) == 1 else f"{prefix}[{','.join(ranges)}]")
    return ",".join(parts)


def _runs(numbers: list[int]) -> Iterator[tuple[int, int]]:
    """Consecutive runs of sorted distinct ``numbers`` as (first, last)."""
    start = prev = numbers[0]
    for n in numbers[1:]:
        if n != prev + 1:
            yield start, prev
            start = n
        prev = n
    yield start, prev
