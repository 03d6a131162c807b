"""Clocks: the controller never reads the time itself; it asks an injected clock."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

from gpufleet.domain.clock import Clock

__all__ = ["Clock", "ManualClock", "ScaledClock", "SystemClock"]


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock tests and the simulator move by hand."""

    def __init__(self, start: datetime) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, by: timedelta) -> datetime:
        with self._lock:
            self._now += by
            return self._now


class ScaledClock:
    """Simulated time running ``speed`` times faster than wall time from ``start`` (the demo's clock)."""

    def __init__(self, start: datetime, speed: float) -> None:
        self.start, self.speed = start, speed
        self._t0 = time.monotonic()

    def now(self) -> datetime:
        return self.start + timedelta(seconds=(time.monotonic() - self._t0) * self.speed)
