"""The leader lease row, read and written under a row lock (the rule itself is ``controller.ha.lease``).

:meth:`LeaseStore.ask` runs ``SELECT ... FOR UPDATE`` on the lease row, takes the database's clock, applies
:func:`~gpufleet.controller.ha.lease.ask` and writes the result, all in one transaction: two replicas
asking at once are serialized by the row lock, so only one of them can move the epoch. The lock waits
at most ``LOCK_TIMEOUT`` for a leader's commit holding the row (the fence's ``FOR SHARE``), then the try
fails and is made again at the next renewal.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, Engine, select, text, update

from gpufleet.controller.ha.lease import Lease, ask, release

from .models import LeaseRow

LOCK_TIMEOUT = "2s"
NAME = "controller"


class LeaseStore:
    def __init__(self, engine: Engine, *, name: str = NAME, now: Callable[[], datetime] | None = None) -> None:
        """``now``: a clock for tests; by default the database's (``clock_timestamp()`` on PostgreSQL)."""
        self.engine = engine
        self.name = name
        self._now = now

    def ask(self, me: str, url: str, length: timedelta) -> tuple[Lease, bool]:
        """The lease after ``me`` asked for it, and whether ``me`` holds it now."""
        with self.engine.begin() as conn:
            current, now = self._locked(conn)
            new = ask(current, me, url, now, length)
            if new is None:
                return current, False
            self._write(conn, new)
            return new, True

    def release(self, me: str) -> bool:
        """Give the lease up if ``me`` holds it (expires now, same epoch); whether it did."""
        with self.engine.begin() as conn:
            current, now = self._locked(conn)
            new = release(current, me, now)
            if new is None:
                return False
            self._write(conn, new)
            return True

    def current(self) -> Lease:
        with self.engine.connect() as conn:
            row = conn.execute(select(LeaseRow.holder, LeaseRow.epoch, LeaseRow.expires, LeaseRow.url)
                               .where(LeaseRow.name == self.name)).one()
        return Lease(row.holder, row.epoch, _utc(row.expires), row.url)

    def _locked(self, conn: Connection) -> tuple[Lease, datetime]:
        postgres = conn.dialect.name == "postgresql"
        if postgres:
            conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
        row = conn.execute(select(LeaseRow.holder, LeaseRow.epoch, LeaseRow.expires, LeaseRow.url)
                           .where(LeaseRow.name == self.name).with_for_update()).one()
        if self._now is not None:
            now = self._now()
        elif postgres:
            now = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
        else:
            now = datetime.now(UTC)
        return Lease(row.holder, row.epoch, _utc(row.expires), row.url), _utc(now)

    def _write(self, conn: Connection, lease: Lease) -> None:
        conn.execute(update(LeaseRow).where(LeaseRow.name == self.name)
                     .values(holder=lease.holder, epoch=lease.epoch, expires=lease.expires, url=lease.url))


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
