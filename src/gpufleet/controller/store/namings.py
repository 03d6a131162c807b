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
    """The namings of the last 30 days live in memory (:meth:`load`, at each rebuild of the correlation
    window, outside any ingest round): the correlator asks during a round, which must not read the
    database behind the round's back (one connection on an in-memory SQLite; a second reader on a
    file). Recorded namings wait until :meth:`flush`, which the controller calls once the round that
    produced them is committed; a round that fails is rolled back and its window replayed, so
    :meth:`discard` drops what it named."""

    def __init__(self, store: Store) -> None:
        self.session = store.session
        self._known: dict[str, list[Naming]] = {}
        self._pending: list[Naming] = []

    def load(self, since: datetime) -> None:
        """Read the namings at or after ``since`` (replacing what memory held)."""
        with self.session() as s:
            rows = s.scalars(select(UnitNamingRow).where(UnitNamingRow.time >= since)
                             .order_by(UnitNamingRow.time)).all()
        known: dict[str, list[Naming]] = {}
        for r in rows:
            known.setdefault(r.serial, []).append(Naming(r.serial, r.component, r.kind, r.time))
        self._known, self._pending = known, []

    def named(self, serial: str, since: datetime) -> Sequence[Naming]:
        return [n for n in self._known.get(serial, ()) if n.time >= since]

    def record(self, naming: Naming) -> None:
        got = self._known.setdefault(naming.serial, [])
        if naming not in got:
            got.append(naming)
            got.sort(key=lambda n: n.time)
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
        """Forget the pending namings (their round was rolled back); memory keeps only what was written."""
        for n in self._pending:
            got = self._known.get(n.serial, [])
            if n in got:
                got.remove(n)
        self._pending.clear()
