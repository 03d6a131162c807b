"""The controller API's event body (``POST /v1/events``): how a producer writes one event.

One event: ``{"id", "node", "kind", "time" (ISO-8601 with zone), "component", "code", "severity", "link",
"message", "source", "attrs": {str: str}}`` (``severity``: only what the source itself stated). The
agent's spool stores events in this form and the check poster sends it; the controller validates it
in one place (``controller/api/schemas.py``: ``EventIn``, which the ingest fast path uses too).
"""

from __future__ import annotations

import json
from typing import TypedDict

from gpufleet.domain.events import HealthEvent


class WireEvent(TypedDict):
    id: str
    node: str
    kind: str
    time: str
    component: str | None
    code: int | None
    severity: str | None
    link: str | None
    message: str
    source: str
    attrs: dict[str, str]


def to_wire(ev: HealthEvent) -> WireEvent:
    return WireEvent(
        id=ev.id,
        node=ev.node,
        kind=ev.kind.value,
        time=ev.time.isoformat(),
        component=ev.component,
        code=ev.code,
        severity=None if ev.severity is None else ev.severity.value,
        link=ev.link,
        message=ev.message,
        source=ev.source,
        attrs=dict(ev.attrs),
    )


def dumps(ev: HealthEvent) -> str:
    return json.dumps(to_wire(ev), separators=(",", ":"))
