"""Durations written the way operators write them: ``90s``, ``30m``, ``24h``, ``7d``, ``1h30m``."""

from __future__ import annotations

import math
import re
from datetime import timedelta

from gpufleet.domain.errors import InvalidInput

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str | float | int, field: str = "duration") -> timedelta:
    """Parse ``text`` (e.g. ``"24h"``, ``"1h30m"``, or a number of seconds) into a timedelta.

    Raises InvalidInput naming ``field`` when the text is not a non-negative duration.
    """
    if isinstance(text, bool):
        raise InvalidInput(field, text, "a duration such as 30s, 10m, 24h or 7d")
    if isinstance(text, int | float):
        if text < 0:
            raise InvalidInput(field, text, "a non-negative number of seconds")
        return timedelta(seconds=float(text))
    s = text.strip().lower().replace(" ", "")
    if not s:
        raise InvalidInput(field, text, "a duration such as 30s, 10m, 24h or 7d")
    try:
        return timedelta(seconds=float(s))
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if pos != len(s) or pos == 0:
        raise InvalidInput(field, text, "a duration such as 30s, 10m, 24h, 7d or 1h30m")
    return timedelta(seconds=total)


def format_duration(td: timedelta) -> str:
    """A compact human form: ``1d2h``, ``3m20s``, ``850ms``."""
    secs = td.total_seconds()
    if secs < 1:
        return f"{secs * 1000:.0f}ms"
    out, rest = [], round(secs)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            out.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(out[:2])


def positive_seconds(text: str | float | int, field: str) -> float:
    """A period that must be positive and finite (a loop's interval): a number of seconds or a
    duration such as ``"30s"`` or ``"5m"``. Raises InvalidInput naming ``field`` otherwise (0 would spin)."""
    try:
        seconds = parse_duration(text, field).total_seconds()
    except (OverflowError, ValueError):  # "inf", "nan"
        seconds = math.nan
    except InvalidInput:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise InvalidInput(field, text, "seconds > 0, or a duration such as 30s or 5m")
    return seconds
