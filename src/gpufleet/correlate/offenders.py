"""Repeat offenders: a unit (by serial, in any slot) named again after an earlier episode.

A part that fails, is repaired or reseated, returns to service and fails again — in the same slot or
after a move — should be replaced, not repaired a third time. The engine records every actionable
verdict that names a unit with a serial (:class:`Naming`) in a :class:`UnitHistory`; when a new
verdict names a serial that was already named in an *earlier episode* (at least ``gap`` before,
within ``window``), the suspect is a repeat offender: its action becomes drain-and-replace and its
reason says when and where it was named before.

The history is a port: :class:`MemoryHistory` for a file run (``gpufleet correlate``), a table in the
controller's database for a controller (it outlives restarts; the correlation window does not).
Recording is idempotent (a controller that rebuilds its window replays the same verdicts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

REPEAT_WINDOW = timedelta(days=30)
REPEAT_GAP = timedelta(hours=12)  # closer namings are one episode (a flapping verdict, one repair)
# Kinds of replaceable unit a serial names (a cable has none; a whole node is judged by the repairer's
# lemon rule, docs/lifecycle.md).
UNIT_KINDS = frozenset({"gpu", "nic", "nvswitch", "compute_tray", "switch_tray"})


@dataclass(frozen=True, slots=True)
class Naming:
    """An actionable verdict named the unit ``serial`` sitting at ``component`` at ``time``."""

    serial: str
    component: str
    kind: str
    time: datetime


class UnitHistory(Protocol):
    def named(self, serial: str, since: datetime) -> Sequence[Naming]:
        """The namings of ``serial`` at or after ``since``, oldest first."""
        ...

    def record(self, naming: Naming) -> None:
        """Keep ``naming`` (recording the same one twice keeps one)."""
        ...


class MemoryHistory:
    """A :class:`UnitHistory` in memory (a file run; tests)."""

    def __init__(self) -> None:
        self._by_serial: dict[str, list[Naming]] = {}

    def named(self, serial: str, since: datetime) -> Sequence[Naming]:
        return [n for n in self._by_serial.get(serial, ()) if n.time >= since]

    def record(self, naming: Naming) -> None:
        got = self._by_serial.setdefault(naming.serial, [])
        if naming not in got:
            got.append(naming)
            got.sort(key=lambda n: n.time)


def earlier_episodes(namings: Sequence[Naming], now: datetime, gap: timedelta = REPEAT_GAP) -> list[Naming]:
    """The first naming of each episode that ended at least ``gap`` before ``now`` (namings closer
    than ``gap`` to each other are one episode)."""
    out: list[Naming] = []
    last: datetime | None = None
    for n in sorted(namings, key=lambda n: n.time):
        if n.time > now - gap:
            break
        if last is None or n.time - last >= gap:
            out.append(n)
        last = n.time
    return out


def repeat_reason(serial: str, before: Sequence[Naming]) -> str:
    where = ", ".join(f"{n.component} at {n.time:%Y-%m-%d %H:%M}" for n in before[-3:])
    return (f"repeat offender: unit {serial} was named {len(before)} time(s) before ({where}) and failed again "
            "after it: replace it")
