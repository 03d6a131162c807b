"""The correlator's repeat-offender history in the database (table ``unit_namings``, migration 0007).

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
    def __init__(self, store: Store) -> None:
        self.session = store.session

    def named(self, serial: str, since: datetime) -> Sequence[Naming]:
        with self.session() as s:
            rows = s.scalars(select(UnitNamingRow).where(UnitNamingRow.serial == serial, UnitNamingRow.time >= since)
                             .order_by(UnitNamingRow.time)).all()
            return [Naming(r.serial, r.component, r.kind, r.time) for r in rows]

    def record(self, naming: Naming) -> None:
        with self.session.begin() as s:
            if s.get(UnitNamingRow, (naming.serial, naming.time, naming.component)) is None:
                s.add(UnitNamingRow(serial=naming.serial, time=naming.time, component=naming.component,
                                    kind=naming.kind))

