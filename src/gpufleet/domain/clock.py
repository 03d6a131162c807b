"""The one clock protocol: code that needs the time asks an injected clock (never ``datetime.now()``).

Implementations live with their users: ``controller/clock.py`` (system, manual and scaled clocks for
the controller, the demo and tests) and ``agent/clock.py`` (which adds a monotonic reading and a
sleep: :class:`~gpufleet.agent.clock.AgentClock`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware (UTC)."""
        ...
