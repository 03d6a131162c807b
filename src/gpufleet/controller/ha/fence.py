"""Fencing: every transaction this replica commits checks, just before COMMIT, that the lease's epoch is
still the one this replica was elected with — and holds the lease row (``FOR SHARE``) until the commit,
so a takeover (``SELECT ... FOR UPDATE`` in ``store.lease``) waits for it, or it sees the new epoch and
is refused.

It hooks the engine's ``commit`` event, so every write of the controller's store goes through it
(decisions, outbox updates, node rows, audit lines, heartbeats, retention's deletes): a deposed leader
that wakes up late (a long GC pause, SIGSTOP, a partition) cannot land anything. Reads commit nothing
and are not fenced. A replica that does not lead (``epoch`` None) commits nothing at all.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from sqlalchemy import Connection, Engine, event

from gpufleet.domain.errors import ExternalError

from ..store.lease import NAME

log = logging.getLogger(__name__)
_CHECK = "SELECT epoch FROM leader_lease WHERE name = %s FOR SHARE"


class Fenced(ExternalError):
    """A write refused: this replica's epoch is not the lease's (it was deposed, or never led)."""

    def __init__(self, mine: int | None, current: int | None) -> None:
        why = ("this replica is not the leader" if mine is None else
               f"epoch {mine} is stale (the lease is at epoch {current}: another replica leads)")
        super().__init__("leader lease", f"write refused: {why}")
        self.mine, self.current = mine, current


class Fence:
    """Installed on the store's engine by :meth:`install`; ``epoch`` is set by the elector."""

    def __init__(self, name: str = NAME) -> None:
        self.name = name
        self.epoch: int | None = None
        self.refused = 0  # writes refused since start (a metric)
        self._lock = threading.Lock()

    def install(self, engine: Engine) -> None:
        if engine.dialect.name != "postgresql":
            raise ValueError(f"fencing needs PostgreSQL, not {engine.dialect.name}")
        event.listen(engine, "commit", self._check)

    def _check(self, conn: Connection) -> None:
        mine = self.epoch
        current: int | None = None
        if mine is not None:
            dbapi: Any = conn.connection.dbapi_connection
            cur = dbapi.cursor()
            try:
                cur.execute(_CHECK, (self.name,))
                row = cur.fetchone()
            finally:
                cur.close()
            current = int(row[0]) if row is not None else None
            if current == mine:
                return
        with self._lock:
            self.refused += 1
        log.warning("fenced: a write refused (replica epoch %s, lease epoch %s)", mine, current)
        raise Fenced(mine, current)
