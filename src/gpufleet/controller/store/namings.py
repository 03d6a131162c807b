"""The correlator's repeat-offender history in the database (table ``unit_namings``, migration 0008).

Implements :class:`gpufleet.correlate.offenders.UnitHistory`: the engine asks which earlier verdicts
named a serial and records each new one. Keyed by (serial, time, slot): recording again what a
rebuilt correlation window replays is a no-op.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select

from gpufleet.correlate.offenders import Naming

from .models import UnitNamingRow
from .repo import Store


class NamingStore:
    """Recorded namings wait in memory until :meth:`flush`, which the controller calls once the ingest
    round that produced them is committed (one writer at a time on SQLite; a round that fails is
    rolled back and its window replayed, so :meth:`discard` drops what it named)."""

    def __init__(self, store: Store) -> None:
        self.session = store.session
        self._pending: list[Naming] = []

    def named(self, serial: str, since: datetime) -> Sequence[Naming]:
        with self.session() as s:
            rows = s.scalars(select(UnitNamingRow).where(UnitNamingRow.serial == serial, UnitNamingRow.time >= since)
                             .order_by(UnitNamingRow.time)).all()
            got = [Naming(r.serial, r.component, r.kind, r.time) for r in rows]
        got += [n for n in self._pending if n.serial == serial and n.time >= since and n not in got]
        return sorted(got, key=lambda n: n.time)

    def record(self, naming: Naming) -> None:
        if naming not in self._pending:
            self._pending.append(naming)

    def flush(self) -> None:
        """Write the pending namings (kept for the next flush if the write fails)."""
        if not self._pending:
            return
        with self.session.begin() as s:
            for n in self._pending:
                if s.get(UnitNamingRow, (n.serial, n.time, n.component)) is None:
                    s.add(UnitNamingRow(serial=n.serial, time=n.time, component=n.component, kind=n.kind))
        self._pending.clear()

    def discard(self) -> None:
        self._pending.clear()
