"""The controller API's event body (``POST /v1/events``), both ways.

One event: ``{"id", "node", "kind", "time" (ISO-8601 with zone), "component", "code", "severity", "link",
"message", "source", "attrs": {str: str}}``. The spool stores events in this form.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TypedDict

from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent, Severity


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


def from_wire(obj: object, where: str = "event") -> HealthEvent:
    """Parse one wire event; raises InvalidInput naming the bad field."""
    if not isinstance(obj, dict):
        raise InvalidInput(where, obj, "a JSON object")
    try:
        kind = EventKind(str(obj.get("kind")))
    except ValueError:
        raise InvalidInput(f"{where}.kind", obj.get("kind"), f"one of {[k.value for k in EventKind]}") from None
    sev = obj.get("severity")
    try:
        severity = None if sev is None else Severity(sev)
    except ValueError:
        raise InvalidInput(f"{where}.severity", sev, "fatal, degraded, info or null") from None
    try:
        when = datetime.fromisoformat(str(obj.get("time")))
    except ValueError:
        raise InvalidInput(f"{where}.time", obj.get("time"), "an ISO-8601 time with a zone") from None
    if when.tzinfo is None:
        raise InvalidInput(f"{where}.time", obj.get("time"), "an ISO-8601 time with a zone")
    ident, node = obj.get("id"), obj.get("node")
    if not isinstance(ident, str) or not ident:
        raise InvalidInput(f"{where}.id", ident, "a non-empty string")
    if not isinstance(node, str) or not node:
        raise InvalidInput(f"{where}.node", node, "a non-empty string")
    attrs = obj.get("attrs") or {}
    if not isinstance(attrs, dict):
        raise InvalidInput(f"{where}.attrs", attrs, "an object of strings")
    code = obj.get("code")
    if code is not None and (not isinstance(code, int) or isinstance(code, bool)):
        raise InvalidInput(f"{where}.code", code, "an integer or null")
    return HealthEvent(
        id=ident,
        node=node,
        kind=kind,
        time=when,
        component=obj.get("component"),
        code=code,
        severity=severity,
        link=obj.get("link"),
        message=str(obj.get("message", "")),
        source=str(obj.get("source", "agent")),
        attrs=tuple(sorted((str(k), str(v)) for k, v in attrs.items())),
    )
