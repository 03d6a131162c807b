"""A bounded on-disk spool of events waiting for the controller (SQLite, one file, crash-safe).

* ``put`` stores events durably (one transaction per call) before they are pushed; an event already
  in the spool (same id) is stored once.
* ``peek(n)`` returns the oldest ``n`` events with their sequence numbers; ``ack(seqs)`` deletes them
  after the controller accepted them. A crash between push and ack resends: at-least-once, and the
  controller deduplicates by event id.
* It also keeps the rules' edges (``armed``: a remap failure, a link seen down), stored with the events
  that reported them and marked with the boot and hardware they were seen on, so that an agent
  restarted on the same boot and hardware does not report them again (decision 0132).
* Bounded: at most ``max_events``. When full, the oldest *non-fatal* events go first, then the oldest
  fatal ones; every eviction is counted in ``dropped`` (exported as a metric) and logged.

Thread-safe (the runner puts, the push worker peeks and acks). WAL journal with ``synchronous=NORMAL``:
a crash of the agent process loses nothing; a power cut may lose the most recent transactions (the
events of the last moments before it), the usual trade of WAL + NORMAL for not syncing every tick.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

from gpufleet.domain import wire
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent, Severity

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS spool (
    seq   INTEGER PRIMARY KEY AUTOINCREMENT,
    id    TEXT NOT NULL UNIQUE,
    fatal INTEGER NOT NULL,
    body  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS armed (key TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS armed_scope (scope TEXT NOT NULL);
"""


# Kinds that come in floods (counters, corrected errors, passing checks): when the spool is full these
# go first, so the rare fault reports survive an outage. A retention rule, not a judgement: the
# controller judges every event (the ``fatal`` column keeps its old name in existing spool files).
_BULK = frozenset({EventKind.ECC_SBE, EventKind.LINK_ERROR, EventKind.AER_CORRECTED, EventKind.CHECK_PASSED,
                   EventKind.THERMAL})


def _keep(ev: HealthEvent) -> bool:
    return ev.severity is Severity.FATAL or ev.kind not in _BULK


class Spool:
    def __init__(self, path: Path | str, max_events: int = 100_000) -> None:
        if max_events < 1:
            raise InvalidInput("spool.max_events", max_events, "at least 1")
        self.path = str(path)
        self.max_events = max_events
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        row = self._db.execute("SELECT value FROM meta WHERE key='dropped'").fetchone()
        self.dropped = int(row[0]) if row else 0
        self._depth = int(self._db.execute("SELECT COUNT(*) FROM spool").fetchone()[0])
        self._scope = ""  # what the edges stored from now on were seen on (:meth:`armed`)

    def put(self, events: Iterable[HealthEvent], armed: Collection[str] | None = None) -> int:
        """Store ``events``; returns how many were new. Evicts when over ``max_events``. ``armed``, when
        given, replaces the standing conditions (:meth:`armed`) in the same transaction: a crash keeps
        both or neither, so a condition is never marked reported without its event, nor the reverse."""
        rows = [(ev.id, int(_keep(ev)), wire.dumps(ev)) for ev in events]
        if not rows and armed is None:
            return 0
        with self._lock:
            cur = self._db.cursor()
            counts = self._depth, self.dropped  # put back if the transaction is
            cur.execute("BEGIN IMMEDIATE")
            try:
                before = self._db.total_changes
                cur.executemany("INSERT OR IGNORE INTO spool(id, fatal, body) VALUES (?, ?, ?)", rows)
                added = self._db.total_changes - before
                self._depth += added
                over = self._depth - self.max_events
                if over > 0:
                    self._evict(cur, over)
                if armed is not None:
                    cur.execute("DELETE FROM armed")
                    cur.executemany("INSERT INTO armed(key) VALUES (?)", [(k,) for k in sorted(armed)])
                    cur.execute("DELETE FROM armed_scope")
                    cur.execute("INSERT INTO armed_scope(scope) VALUES (?)", (self._scope,))
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                self._depth, self.dropped = counts
                raise
        return added

    def _evict(self, cur: sqlite3.Cursor, n: int) -> None:
        cur.execute("DELETE FROM spool WHERE seq IN (SELECT seq FROM spool WHERE fatal=0 ORDER BY seq LIMIT ?)", (n,))
        gone = cur.rowcount
        if gone < n:
            cur.execute("DELETE FROM spool WHERE seq IN (SELECT seq FROM spool ORDER BY seq LIMIT ?)", (n - gone,))
            gone += cur.rowcount
        self._depth -= gone
        self.dropped += gone
        cur.execute(
            "INSERT INTO meta(key, value) VALUES ('dropped', ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (self.dropped,),
        )
        log.warning(
            "spool full (%d events): dropped the %d oldest (routine kinds first); %d dropped in all",
            self.max_events,
            gone,
            self.dropped,
        )

    def armed(self, scope: str) -> frozenset[str]:
        """The edges the agent's last run stored (``PassiveChecks.take_armed``) when they were seen on
        ``scope`` (the boot and the hardware: ``Agent._scope``), else none: restored at start, so a restart
        does not report again what still stands (decision 0132). ``scope`` is also what the edges stored
        from now on are marked with; "" keeps nothing (what is stored with it is never restored)."""
        with self._lock:
            self._scope = scope
            row = self._db.execute("SELECT scope FROM armed_scope").fetchone()
            if not scope or row is None or row[0] != scope:
                return frozenset()
            return frozenset(str(k) for (k,) in self._db.execute("SELECT key FROM armed"))

    def peek(self, n: int) -> list[tuple[int, str]]:
        """The oldest ``n`` events as ``(seq, json body)``."""
        with self._lock:
            return [
                (int(s), str(b)) for s, b in self._db.execute("SELECT seq, body FROM spool ORDER BY seq LIMIT ?", (n,))
            ]

    def ack(self, seqs: Sequence[int]) -> None:
        if not seqs:
            return
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            cur.executemany("DELETE FROM spool WHERE seq = ?", [(s,) for s in seqs])
            self._depth -= max(0, cur.rowcount)
            cur.execute("COMMIT")

    def drop(self, seqs: Sequence[int], reason: str) -> None:
        """Remove events the controller will never accept (counted as dropped)."""
        self.ack(seqs)
        with self._lock:
            self.dropped += len(seqs)
            self._db.execute(
                "INSERT INTO meta(key, value) VALUES ('dropped', ?) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (self.dropped,),
            )
        log.error("dropped %d event(s) the controller rejected: %s", len(seqs), reason)

    def __len__(self) -> int:
        return self._depth

    def close(self) -> None:
        with self._lock:
            self._db.close()
