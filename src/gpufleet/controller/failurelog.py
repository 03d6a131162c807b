"""Repeated failures, logged without a flood: a database outage fails the reconciler's every pass, the
lease's every renewal and every request the same way, and each used to log it (a 30 s PostgreSQL outage:
~900 lines, most of them tracebacks).

One :class:`FailureLog` per loop or call site. In an *episode* (from a failure to the next success):

* the first failure of each kind (its type and first line: :func:`~gpufleet.controller.store.db.brief`)
  is logged as before, with its traceback where the site logged one;
* repeats are counted, and a WARNING says how many at most every ``every_s`` seconds;
* the first success after failures logs one WARNING line: working again, after how many failures, over
  how long, and the last error.

A site that never learns of a success (an HTTP handler that sees only errors) ends an episode when
``every_s`` pass without a failure: the next failure is logged in full again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .store.db import brief

SUMMARY_EVERY_S = 60.0  # at most one "still failing" line per site this often
MAX_KINDS = 5  # different failures logged in full per episode (the rest only counted)


class FailureLog:
    def __init__(self, logger: logging.Logger, what: str, *, level: int = logging.ERROR,
                 every_s: float = SUMMARY_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.what, self.level, self.every_s, self._clock = logger, what, level, every_s, clock
        self._lock = threading.Lock()
        self._kinds: set[str] = set()
        self.failures = 0  # in the current episode
        self._since = self._last = self._said = 0.0
        self._latest = ""
        self._unsaid = 0  # failures since the last line about them

    def failed(self, err: BaseException, note: str = "", *, trace: bool = True) -> None:
        """``err`` happened (``note``: what is done about it, e.g. "; retrying in 1.0 s")."""
        kind = brief(err)
        with self._lock:
            now = self._clock()
            if self.failures and now - self._last > self.every_s:
                self._end()  # quiet for a while: a new episode
            if not self.failures:
                self._since = self._said = now
            self.failures += 1
            self._last, self._latest = now, kind
            if kind not in self._kinds and len(self._kinds) < MAX_KINDS:
                self._kinds.add(kind)
                self._said = now
                self.log.log(self.level, "%s failed (%s)%s", self.what, kind, note, exc_info=err if trace else None)
                return
            self._unsaid += 1
            if now - self._said >= self.every_s:
                self.log.warning("%s: still failing: %d more failure(s) in the last %.0f s (latest: %s)%s",
                                 self.what, self._unsaid, now - self._said, kind, note)
                self._said, self._unsaid = now, 0

    def ok(self) -> None:
        """It worked: after failures, say so once."""
        if not self.failures:  # the common case, without the lock
            return
        with self._lock:
            if self.failures:
                self.log.warning("%s: working again after %d failure(s) over %.0f s (last: %s)", self.what,
                                 self.failures, self._clock() - self._since, self._latest)
                self._end()

    def _end(self) -> None:
        self.failures, self._unsaid = 0, 0
        self._kinds.clear()
