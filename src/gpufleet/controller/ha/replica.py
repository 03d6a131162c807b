"""Wiring one replica into the election (used by ``runtime.build``).

On PostgreSQL every replica takes part: its store's engine gets the fence and a bounded idle time in a
transaction (a replica stopped mid-commit must not hold the lease row for longer than a lease), and an
:class:`~.elector.Elector` runs in its own thread. On SQLite there is one replica, which always leads.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, event

from ..store.db import make_engine
from ..store.lease import LeaseStore
from .elector import Elector, Leadership, always_leading
from .fence import Fence


def replica_id() -> str:
    """Unique per process start: a restarted replica is a new holder (it must rebuild, so takes a new epoch)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def elected(engine: Engine) -> bool:
    """Whether replicas on this database elect a leader (PostgreSQL) or there is only one (SQLite)."""
    return engine.dialect.name == "postgresql"


def bound_idle_transactions(engine: Engine, lease_s: float) -> None:
    """A session idle inside a transaction for ``lease_s`` is ended by PostgreSQL (its locks released):
    a leader paused between its fence check and COMMIT cannot block a takeover for longer. Installed
    before the engine's first connection."""
    ms = max(1000, int(lease_s * 1000))

    @event.listens_for(engine, "connect")
    def _timeout(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute(f"SET idle_in_transaction_session_timeout = {ms}")
        cur.close()
        dbapi_conn.commit()


def join(engine: Engine, *, lease_s: float, renew_s: float, url: Callable[[], str],
         on_gain: Callable[[int], None]) -> tuple[Leadership, Elector | None]:
    """This replica's :class:`Leadership` and, on PostgreSQL, its elector (fence installed on ``engine``,
    the lease asked for once right away: a lone replica leads as soon as it is built)."""
    if not elected(engine):
        return always_leading(), None
    fence = Fence()
    fence.install(engine)
    leadership = Leadership(replica_id(), fence=fence)
    leases = LeaseStore(make_engine(engine.url.render_as_string(hide_password=False)))
    elector = Elector(leases, leadership, fence, lease_s=lease_s, renew_s=renew_s, url=url, on_gain=on_gain)
    elector.step()
    return leadership, elector
