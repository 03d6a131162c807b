"""Time, injected: the runner, the simulated device and the push worker never call ``time`` directly."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol

from gpufleet.domain.clock import Clock


class AgentClock(Clock, Protocol):
    """The domain's :class:`~gpufleet.domain.clock.Clock` plus what a polling loop needs."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for cadences and backoff)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (returns early when the clock is stopped)."""
        ...


class SystemClock:
    """The real clock. ``stop()`` wakes every sleeper at once (used for a prompt shutdown)."""

    def __init__(self) -> None:
        self._stopped = threading.Event()

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._stopped.wait(seconds)

    def stop(self) -> None:
        self._stopped.set()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()


class FakeClock:
    """A clock that moves only when slept on or advanced (tests, simulator, benchmarks)."""

    def __init__(self, start: datetime | None = None) -> None:
        self._start = start or datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
        self._t = 0.0

    def now(self) -> datetime:
        return self._start + timedelta(seconds=self._t)

    def monotonic(self) -> float:
        return self._t

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self._t += seconds
