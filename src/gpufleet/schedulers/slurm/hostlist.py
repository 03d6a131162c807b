"""Slurm host lists: ``n[1-3,7],gpu[008-010],login`` <-> individual names.

``squeue --json`` reports a job's nodes as one host-list expression; the adapter needs the names.
Zero padding is kept (``gpu[008-010]`` -> ``gpu008, gpu009, gpu010``). Only one bracket group per
name is supported, which is what Slurm itself prints for flat node names.
"""

from __future__ import annotations

import re

from gpufleet.domain.errors import InvalidInput

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


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
