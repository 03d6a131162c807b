"""Which physical unit (serial) sits in which slot now, and the history of moves.

A ``moved`` event takes the unit ``serial`` out of slot ``from`` and puts it in slot ``to``; the
units inside it (a tray's GPUs and NICs) move with it, to the same relative positions. The engine
archives the symptoms seen at the old slot in a :class:`MoveRecord`, so that later evidence can be
compared: a pattern that reappears at the new slot follows the unit; one that reappears at the old
slot, now holding another unit, stays with the slot (its cabling or port).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpufleet.correlate.model import Ref
from gpufleet.domain.topology import Topology

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MoveRecord:
    serial: str
    from_slot: str
    to_slot: str
    time: datetime
    symptoms: int  # distinct active symptoms at the old slot when the unit left it
    evidence: tuple[Ref, ...]  # those symptoms' events, plus the move event itself


class Inventory:
    """Serial-to-slot map over a topology, updated by moves; remembers moves for ``memory``."""

    def __init__(self, topology: Topology, memory: timedelta = timedelta(days=7)) -> None:
        self._topo = topology
        self._memory = memory
        self._at: dict[str, str | None] = {}  # overrides of the topology's serials, by slot
        self._records: list[MoveRecord] = []
        self._limbo: dict[str, dict[str, str | None]] = {}  # displaced units by serial: suffix -> serial

    @property
    def memory(self) -> timedelta:
        return self._memory

    def serial_at(self, slot: str) -> str | None:
        if slot in self._at:
            return self._at[slot]
        comp = self._topo.get(slot)
        return comp.serial if comp is not None and comp.serial else None

    def move(self, serial: str, from_slot: str, to_slot: str) -> list[str]:
        """Apply a move; returns the slots (old and new subtrees) whose occupant changed.

        The unit displaced from ``to_slot`` (if any) waits, with the units inside it, until a move
        event names it (a swap is two moves: X a->b, then Y b->a).
        """
        changed: list[str] = []
        if self.serial_at(from_slot) == serial:
            carried = self._subtree_serials(from_slot)
            for slot in (from_slot, *self._topo.descendants(from_slot)):
                self._at[slot] = None
                changed.append(slot)
        elif serial in self._limbo:
            carried = self._limbo.pop(serial)
        else:
            log.info("%s: move of serial %s, inventory had %s", from_slot, serial, self.serial_at(from_slot))
            carried = {"": serial}
        displaced = self.serial_at(to_slot)
        if displaced is not None and displaced != serial:
            self._limbo[displaced] = self._subtree_serials(to_slot)
        for suffix, ser in carried.items():
            dest = to_slot + suffix
            if dest in self._topo.components:
                self._at[dest] = ser
                changed.append(dest)
        return changed

    def _subtree_serials(self, slot: str) -> dict[str, str | None]:
        # Units inside move to the same relative position: their ids extend the unit's id (as the
        # generators name them); a child named otherwise stays with its slot.
        inside = (s for s in (slot, *self._topo.descendants(slot)) if s.startswith(slot))
        return {s[len(slot) :]: self.serial_at(s) for s in inside}

    def record(self, rec: MoveRecord) -> None:
        self._records.append(rec)

    def forget_before(self, t: datetime) -> None:
        cutoff = t - self._memory
        if self._records and self._records[0].time < cutoff:
            self._records = [r for r in self._records if r.time >= cutoff]

    def follows(self, slots: tuple[str, ...], *, weak: bool = False) -> MoveRecord | None:
        """A move that brought a previously symptomatic unit into one of ``slots`` (still there);
        ``weak``: any such move (the coherence statistic found the unit's weak pattern at both slots)."""
        for rec in reversed(self._records):
            if (rec.symptoms or weak) and rec.to_slot in slots and self.serial_at(rec.to_slot) == rec.serial:
                return rec
        return None

    def stays(self, slots: tuple[str, ...], *, weak: bool = False) -> MoveRecord | None:
        """A move that took a symptomatic unit out of one of ``slots`` (now holding another unit);
        ``weak``: any such move (the slot's weak pattern was seen under both units)."""
        for rec in reversed(self._records):
            if (rec.symptoms or weak) and rec.from_slot in slots and self.serial_at(rec.from_slot) != rec.serial:
                return rec
        return None
