"""Group commit for event ingest (and agents' heartbeats): concurrent requests share one transaction.

Each ``POST /v1/events`` hands its batch to :class:`GroupCommitter` and waits for its own answer. One
writer thread takes every batch queued since its last round and gives them to
:meth:`Controller.ingest_many`, which applies them in arrival order and writes them in ONE transaction
(one dedup query, one INSERT, one commit — one fsync on SQLite). The answer to a request still comes only
after its events are durable, and each batch is still accepted or rejected whole.

Heartbeats queue the same way and are recorded with one UPDATE per round (12,500 agents beating every
30 s are another 417 requests a second; one transaction each cost a COMMIT each).

There is no waiting window: while one round is being written, the next requests queue up, so the groups
grow with the load by themselves (one batch per round when idle, dozens under load) and an idle
controller answers as fast as before.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from gpufleet.domain.errors import ExternalError, GpufleetError, Overloaded
from gpufleet.domain.events import HealthEvent

from .service import Controller, Heartbeat, IngestResult

log = logging.getLogger(__name__)

MAX_GROUP_EVENTS = 5_000  # bounds one transaction's size (and the time the controller lock is held)
# Events (a heartbeat counts as one) waiting for the writer before new work is refused with a 429: about
# two seconds of work at the measured rate (docs/benchmarks.md), so a request accepted waits at most that
# long instead of the queue, its memory and every request's latency growing without bound.
MAX_QUEUED_EVENTS = 10_000
RETRY_AFTER_S = 1.0


@dataclass(slots=True)
class _Batch:
    events: Sequence[HealthEvent]
    future: Future[IngestResult]


@dataclass(slots=True)
class _Beat:
    beat: Heartbeat
    future: Future[None]


class GroupCommitter:
    def __init__(self, controller: Controller, *, max_group_events: int = MAX_GROUP_EVENTS,
                 max_queued_events: int = MAX_QUEUED_EVENTS) -> None:
        if max_group_events < 1:
            raise ValueError(f"max_group_events must be at least 1, got {max_group_events}")
        if max_queued_events < 1:
            raise ValueError(f"max_queued_events must be at least 1, got {max_queued_events}")
        self.controller = controller
        self.max_group_events = max_group_events
        self.max_queued_events = max_queued_events
        self.queued = 0  # events (and heartbeats) accepted into the queue, not yet taken by the writer
        self.refused = 0  # requests answered 429 since start (a metric)
        self._queue: queue.SimpleQueue[_Batch | _Beat | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()  # guards starting the thread, closing, and queueing
        self._closed = False
        self.rounds = 0  # how many event transactions were written (for tests and metrics)
        self.batches = 0
        self.events_accepted = 0  # outcomes since start (controller.metrics)
        self.events_duplicate = 0
        self.batches_refused = 0

    @property
    def depth(self) -> int:
        """Reports queued for the writer (approximate: read without a lock)."""
        return self._queue.qsize()

    def submit(self, events: Sequence[HealthEvent]) -> Future[IngestResult]:
        """Queue one batch; the future resolves after it is durable (or fails with its GpufleetError)."""
        fut: Future[IngestResult] = Future()
        self._enqueue(_Batch(events, fut), "events")
        return fut

    def submit_heartbeat(self, beat: Heartbeat) -> Future[None]:
        """Queue one heartbeat; all heartbeats of a round are recorded with one UPDATE."""
        fut: Future[None] = Future()
        self._enqueue(_Beat(beat, fut), "heartbeats")
        return fut

    def close(self, timeout: float = 5.0) -> None:
        """Finish the queued work, refuse new work, and stop the writer thread."""
        with self._start_lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    def check_room(self) -> None:
        """Raise Overloaded (429) when the queue is already full: the ingest fast path asks before it
        parses a body, so refusing costs a read, not a parse and a validation of every event."""
        with self._start_lock:
            self._refuse_if_full(1)

    def _refuse_if_full(self, size: int) -> None:
        if self.queued and self.queued + size > self.max_queued_events:
            self.refused += 1
            raise Overloaded("controller", f"ingest queue full ({self.queued} events waiting); retry later",
                             retry_after_s=RETRY_AFTER_S)

    def _enqueue(self, item: _Batch | _Beat, what: str) -> None:
        """Queue ``item``; raises Overloaded (a 429 with Retry-After) when the queue is full."""
        size = len(item.events) if isinstance(item, _Batch) else 1
        with self._start_lock:  # one lock with close(): nothing can be queued behind the stop marker
            if self._closed:
                item.future.set_exception(ExternalError("controller", f"shutting down: not accepting {what}"))
                return
            self._refuse_if_full(size)
            self.queued += size
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ingest-writer", daemon=True)
                self._thread.start()
            self._queue.put(item)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batches: list[_Batch] = []
            beats: list[_Beat] = []
            item: _Batch | _Beat | None = first
            size, taken, stop = 0, 0, False
            while item is not None:
                taken += len(item.events) if isinstance(item, _Batch) else 1
                # A request whose caller gave up (its future was cancelled) is skipped; one taken here
                # can no longer be cancelled, so resolving it below cannot fail.
                if item.future.set_running_or_notify_cancel():
                    if isinstance(item, _Batch):
                        batches.append(item)
                        size += len(item.events)
                    else:
                        beats.append(item)
                        size += 1
                if size >= self.max_group_events:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
            with self._start_lock:
                self.queued -= taken
            try:
                if batches:
                    self._write(batches)
                if beats:
                    self._beat(beats)
            except BaseException as err:  # never let the writer die: fail what is left of the round
                log.exception("ingest writer round failed")
                failure = ExternalError("controller", f"ingest failed: {err}")
                futures: list[Future[IngestResult] | Future[None]] = [b.future for b in batches]
                futures += [b.future for b in beats]
                for fut in futures:
                    if not fut.done():
                        fut.set_exception(failure)
            if stop:
                return

    def _write(self, group: list[_Batch]) -> None:
        try:
            results = self.controller.ingest_many([b.events for b in group])
        except Exception as err:  # a bug, not bad input: fail this round's requests, keep serving
            log.exception("ingest round of %d batches failed", len(group))
            results = [_failure(err, "ingest")] * len(group)
        self.rounds += 1
        self.batches += len(group)
        for b, result in zip(group, results, strict=True):
            if isinstance(result, GpufleetError):
                self.batches_refused += 1
                b.future.set_exception(result)
            else:
                self.events_accepted += result.accepted
                self.events_duplicate += result.duplicates
                b.future.set_result(result)

    def _beat(self, beats: list[_Beat]) -> None:
        try:
            errors = self.controller.heartbeats([b.beat for b in beats])
        except Exception as err:
            log.exception("heartbeat round of %d failed", len(beats))
            errors = [_failure(err, "heartbeats")] * len(beats)
        for b, error in zip(beats, errors, strict=True):
            if error is None:
                b.future.set_result(None)
            else:
                b.future.set_exception(error)


def _failure(err: Exception, what: str) -> GpufleetError:
    return err if isinstance(err, GpufleetError) else ExternalError("controller", f"{what} failed: {err}")
