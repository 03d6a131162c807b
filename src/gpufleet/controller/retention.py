"""Event retention: the events table is the one that grows with the fleet (every agent's observations),
so events received longer ago than ``[retention] events`` are deleted — optionally archived first —
by a background thread, oldest first, in small transactions.

* **Never blocks ingest for long.** Each batch (``batch`` rows, default 2,000) is one short transaction
  (one DELETE; rows are read only to archive them), and the thread pauses between batches at least as
  long as the batch took (:data:`MIN_PAUSE_S` at least): ingest's group commit waits at most for one.
  Events are found by the primary key's order, not by a scan: the single ingest writer inserts them in
  the order it receives them, so the old ones are a prefix of ``seq`` (a batch is the first ``batch``
  rows by ``seq``, each checked against the cutoff).
* **Never deletes what the policy still reads.** The horizon must be longer than the policy's lookback
  (its evidence window or longest escalation window) and than a week (decisions cite their evidence);
  :func:`check_horizon` refuses a shorter one at start-up, naming the setting.
* **Archive.** With ``archive_dir``, each batch is appended to ``events-YYYY-MM-DD.jsonl.gz`` (by the
  events' receive date, UTC; one JSON object per event, the API's form) and fsynced before the rows are
  deleted, outside any transaction: a crash between the two leaves a duplicate line in the archive, never
  a lost event.
* **Diagnostic bundles** (``[retention] bundles``, off by default): bundles captured longer ago than that
  are deleted at each run, in one statement (there are a few per repair, not millions). At least 7 days:
  a vendor's RMA asks for them.
* **Checkpoint reports** follow the events' horizon: the store keeps one row per job (its latest), and a
  job whose latest was received longer ago than ``events`` is forgotten at each run (long finished; a
  job still running that has not checkpointed for that long counts as never having checkpointed: its
  work at risk is counted from its start, which is only more cautious).
* **Bounded per run.** At most ``max_batches`` per run, so a large backlog (retention switched on for
  an old database) is worked off over several runs while everything else goes on.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select

from gpufleet.controller.clock import Clock
from gpufleet.controller.ha.fence import Fenced
from gpufleet.controller.store.models import BundleRow, EventRow
from gpufleet.controller.store.repo import Store
from gpufleet.domain.durations import format_duration
from gpufleet.domain.errors import InvalidInput

log = logging.getLogger(__name__)

MIN_HORIZON = timedelta(days=7)


def check_horizon(keep: timedelta, lookback: timedelta) -> None:
    """Refuse a horizon that would delete evidence the policy still reads (or decisions still cite)."""
    floor = max(MIN_HORIZON, lookback)
    if keep < floor:
        raise InvalidInput("retention.events", format_duration(keep),
                           f"0 (keep every event) or at least {format_duration(floor)} (the policy's lookback, "
                           "at least 7d)")


MIN_BUNDLE_HORIZON = timedelta(days=7)
# Between two batches of one run the thread waits as long as the batch took, and at least this long: SQLite's
# busy handler retries a waiting writer after sleeps of up to 50 ms, so a shorter gap is one ingest misses
# (back-to-back batches put 0.08-0.3 s on ingest's p99 at 1,250 reports/s; bench retention).
MIN_PAUSE_S = 0.05


class Retention:
    def __init__(self, store: Store, clock: Clock, keep: timedelta, *, batch: int = 2000, max_batches: int = 50,
                 archive_dir: Path | None = None, bundles: timedelta = timedelta(0),
                 min_pause_s: float = MIN_PAUSE_S) -> None:
        if batch < 1 or max_batches < 1:
            raise InvalidInput("retention.batch", batch, "1 or more rows per batch and batches per run")
        if bundles and bundles < MIN_BUNDLE_HORIZON:
            raise InvalidInput("retention.bundles", format_duration(bundles),
                               f"0 (keep every bundle) or at least {format_duration(MIN_BUNDLE_HORIZON)}")
        self.store, self.clock, self.keep = store, clock, keep
        self.bundles_keep = bundles  # 0: keep every diagnostic bundle
        self.bundles_deleted = 0
        self.checkpoints_deleted = 0
        self.batch, self.max_batches = batch, max_batches
        self.min_pause_s = min_pause_s
        self.archive_dir = archive_dir
        self.deleted = 0  # totals since start, for /metrics
        self.archived = 0
        self.on_run: list[Callable[[int, int], None]] = []  # observers: (deleted, archived) per run

    def run_once(self, go_on: Callable[[], bool] = lambda: True) -> int:
        """Delete (and archive) events received before now - keep, up to ``max_batches`` batches; returns
        how many were deleted. Diagnostic bundles older than ``bundles`` go too (when set). ``go_on`` is
        asked before each batch after the first: a replica that stopped leading (or is shutting down)
        stops between batches instead of having its next delete refused by the fence."""
        if self.bundles_keep:
            self._old_bundles(self.clock.now() - self.bundles_keep)
        if not self.keep:
            return 0
        cutoff = self.clock.now() - self.keep
        gone = self.store.prune_checkpoints(cutoff)
        if gone:
            self.checkpoints_deleted += gone
            log.info("retention: %d jobs' checkpoints received before %s forgotten", gone,
                     cutoff.isoformat(timespec="seconds"))
        total = archived = 0
        for i in range(self.max_batches):
            if i and not go_on():
                break
            t0 = time.monotonic()
            n, a, more = self._batch(cutoff)
            total, archived = total + n, archived + a
            self.deleted += n  # per batch: a run cut short still counts what it deleted
            self.archived += a
            if not more:
                break
            if i + 1 < self.max_batches:  # ingest's turn: at most half the time, and a gap its writer sees
                time.sleep(max(self.min_pause_s, time.monotonic() - t0))
        if total:
            log.info("retention: %d events received before %s deleted%s", total, cutoff.isoformat(timespec="seconds"),
                     f" ({archived} archived to {self.archive_dir})" if self.archive_dir else "")
        for observe in self.on_run:
            observe(total, archived)
        return total

    def run_forever(self, stop: threading.Event, interval: float,
                    leading: Callable[[], bool] = lambda: True) -> None:
        """Runs while ``leading()`` (only the leader replica deletes); a run stops between batches when
        this replica stops leading or ``stop`` is set. A write the fence refused (the lead lost during a
        batch) is a warning, not a failure: the leader's next run goes on from the same place."""
        while not stop.is_set():
            try:
                if leading():
                    self.run_once(lambda: leading() and not stop.is_set())
            except Fenced as err:
                log.warning("retention: this replica stopped leading during a run (%s); the leader's next run "
                            "goes on", err)
            except Exception:  # a failed run (database away) is retried at the next interval
                log.exception("retention run failed; retrying in %.0f s", interval)
            stop.wait(interval)

    def _old_bundles(self, cutoff: datetime) -> int:
        with self.store.session.begin() as s:  # by the cutoff, not by a list of ids: years of repairs can be many
            gone = len(list(s.scalars(delete(BundleRow).where(BundleRow.created < cutoff).returning(BundleRow.id))))
        if gone:
            self.bundles_deleted += gone
            log.info("retention: %d diagnostic bundles captured before %s deleted", gone,
                     cutoff.isoformat(timespec="seconds"))
        return int(gone)

    def _batch(self, cutoff: datetime) -> tuple[int, int, bool]:
        """One transaction: the first ``batch`` events by seq, those received before ``cutoff`` archived
        and deleted. Returns (deleted, archived, whether a full batch was old: more may follow).

        Without an archive it is one DELETE whose rows never come to Python: reading 2,000 full rows
        as objects held the interpreter long enough to put 0.3 s on ingest's p99 (bench retention).
        With one, the rows are read as plain columns in a read-only transaction, written and fsynced
        to the archive outside any transaction, then deleted by one DELETE of the old rows up to the
        last one read: the rows read as ORM objects, the archive written and the delete by a list of
        2,000 keys, all inside one transaction, cost the thread twice the CPU per batch (bench retention,
        2026-11-27) and held the transaction across the fsync.
        Rows with a lower ``seq`` that were not yet visible when the batch was read are recent (not
        before ``cutoff``), so the DELETE takes exactly the rows archived."""
        if self.archive_dir is None:
            first = select(EventRow.seq).order_by(EventRow.seq).limit(self.batch).scalar_subquery()
            with self.store.session.begin() as s:
                gone = s.execute(delete(EventRow).where(EventRow.seq.in_(first), EventRow.received < cutoff))
                n = int(getattr(gone, "rowcount", 0) or 0)
                return n, 0, n == self.batch
        with self.store.session() as s:
            rows = list(s.execute(select(*_ARCHIVED).order_by(EventRow.seq).limit(self.batch)))
        old = [r for r in rows if _utc(r.received) < cutoff]
        if not old:
            return 0, 0, False
        self._archive(old)
        with self.store.session.begin() as s:
            s.execute(delete(EventRow).where(EventRow.seq <= old[-1].seq, EventRow.received < cutoff))
        return len(old), len(old), len(old) == len(rows) == self.batch

    def _archive(self, rows: list[Any]) -> None:
        assert self.archive_dir is not None
        self.archive_dir.mkdir(parents=True, exist_ok=True)
        by_day: dict[str, list[str]] = {}
        for r in rows:
            by_day.setdefault(_utc(r.received).strftime("%Y-%m-%d"), []).append(json.dumps(_doc(r), default=str))
        for day, lines in by_day.items():
            path = self.archive_dir / f"events-{day}.jsonl.gz"
            with open(path, "ab") as raw:  # one gzip member per batch: gzip readers read them as one stream
                with gzip.GzipFile(fileobj=raw, mode="wb") as gz:
                    gz.write(("\n".join(lines) + "\n").encode())
                raw.flush()
                os.fsync(raw.fileno())


# what an archived line holds (_doc): the event's columns, read as plain values
_ARCHIVED = (EventRow.seq, EventRow.id, EventRow.node, EventRow.kind, EventRow.time, EventRow.component,
             EventRow.code, EventRow.severity, EventRow.link, EventRow.message, EventRow.source, EventRow.attrs,
             EventRow.received, EventRow.fault_of)


def _doc(r: Any) -> dict[str, Any]:
    return {"seq": r.seq, "id": r.id, "node": r.node, "kind": r.kind, "time": _utc(r.time).isoformat(),
            "component": r.component, "code": r.code, "severity": r.severity, "link": r.link,
            "message": r.message, "source": r.source, "attrs": r.attrs, "received": _utc(r.received).isoformat(),
            "fault_of": r.fault_of}


def _utc(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)
