"""Small builders for hand-written event streams."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpufleet.domain.eventio import FileEvent
from gpufleet.domain.events import EventKind

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


class Stream:
    """Events with increasing line numbers; ``at`` is seconds after T0."""

    def __init__(self) -> None:
        self.events: list[FileEvent] = []

    def add(
        self,
        at: float,
        kind: EventKind,
        component: str = "",
        *,
        code: int | None = None,
        link: str | None = None,
        serial: str | None = None,
        src: str | None = None,
        dst: str | None = None,
    ) -> int:
        line = len(self.events)
        self.events.append(
            FileEvent(
                line=line,
                time=T0 + timedelta(seconds=at),
                kind=kind,
                component=component,
                code=code,
                link=link,
                serial=serial,
                from_slot=src,
                to_slot=dst,
            )
        )
        return line
