"""``gpufleet.event/v1``: health events as JSON Lines, one object per line (docs/formats.md).

::

    {"time": "2026-11-21T12:00:03Z", "kind": "xid", "component": "r01-n03-gpu5", "code": 79}
    {"time": "2026-11-21T12:00:04Z", "kind": "link_error", "component": "r01-n03-nic5",
     "link": "r01-n03-nic5~leaf-su1-r5"}
    {"time": "2026-11-21T13:00:00Z", "kind": "moved", "serial": "TRAY-0042",
     "from": "r01-ct03", "to": "r02-ct07"}

A file event names a topology ``component`` (a slot id) rather than a node. Parsing is strict: a bad
line raises :class:`~gpufleet.domain.errors.InvalidInput` whose field names the line number and key
(``line 12: code``). Blank lines and lines starting with ``#`` are skipped (they keep their number).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, Severity

FORMAT = "gpufleet.event/v1"

_KINDS: dict[str, EventKind] = {k.value: k for k in EventKind}
_SEVERITIES: dict[str, Severity] = {s.value: s for s in Severity}
# Every allowed field and the JSON type it must have (null is accepted as "absent").
_FIELDS: dict[str, type] = {
    "time": str,
    "kind": str,
    "component": str,
    "code": int,
    "link": str,
    "serial": str,
    "from": str,
    "to": str,
    "severity": str,
    "message": str,
    "id": str,
    "node": str,
}
_CODED = frozenset({EventKind.XID, EventKind.SXID})


@dataclass(frozen=True, slots=True)
class FileEvent:
    """One ``gpufleet.event/v1`` line. ``line`` is its 0-based line number (the verdicts' evidence)."""

    line: int
    time: datetime
    kind: EventKind
    component: str = ""
    code: int | None = None
    link: str | None = None
    serial: str | None = None
    from_slot: str | None = None
    to_slot: str | None = None
    severity: Severity | None = None
    message: str = ""
    id: str = ""
    node: str = ""


def parse_time(value: Any, field: str) -> datetime:
    """An ISO-8601 time with a zone (``2026-11-21T12:00:03Z``) as an aware UTC datetime."""
    if not isinstance(value, str):
        raise InvalidInput(field, value, "an ISO-8601 time with a zone, e.g. 2026-11-21T12:00:03Z")
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInput(field, value, "an ISO-8601 time with a zone, e.g. 2026-11-21T12:00:03Z") from None
    if dt.tzinfo is UTC:
        return dt
    if dt.tzinfo is None:
        raise InvalidInput(field, value, "a time with a zone (Z or +hh:mm)")
    return dt.astimezone(UTC)


def parse_event(obj: Any, line: int = 0) -> FileEvent:
    """Validate one decoded JSON object into a :class:`FileEvent`."""
    if not isinstance(obj, dict):
        raise InvalidInput(f"line {line}", obj, "a JSON object")
    for key, v in obj.items():
        typ = _FIELDS.get(key)
        if typ is None:
            raise InvalidInput(f"line {line}: {key}", v, f"one of the fields {sorted(_FIELDS)}")
        if v is not None and type(v) is not typ:
            if key == "code":
                raise InvalidInput(f"line {line}: code", v, "a non-negative integer")
            if key not in ("time", "kind", "severity"):  # those three have their own messages below
                raise InvalidInput(f"line {line}: {key}", v, "a string")
    get = obj.get
    kind = _KINDS.get(get("kind"))  # type: ignore[arg-type]
    if kind is None:
        raise InvalidInput(f"line {line}: kind", get("kind"), f"one of {sorted(_KINDS)}")
    time = parse_time(get("time"), f"line {line}: time")
    severity = None
    if "severity" in obj:
        severity = _SEVERITIES.get(obj["severity"])
        if severity is None:
            raise InvalidInput(f"line {line}: severity", obj["severity"], f"one of {sorted(_SEVERITIES)}")
    code = get("code")
    if code is not None and code < 0:
        raise InvalidInput(f"line {line}: code", code, "a non-negative integer")
    if kind is EventKind.MOVED:
        for key in ("serial", "from", "to"):
            if not get(key):
                raise InvalidInput(
                    f"line {line}: {key}", get(key), "a non-empty string (moved events name serial, from, to)"
                )
    else:
        if not get("component"):
            raise InvalidInput(f"line {line}: component", get("component"), "a topology component id")
        if code is None and kind in _CODED:
            raise InvalidInput(f"line {line}: code", None, f"an integer code ({kind.value} events carry one)")
    return FileEvent(  # positional: measurably cheaper than keywords on this hot path
        line,
        time,
        kind,
        get("component") or "",
        code,
        get("link"),
        get("serial"),
        get("from"),
        get("to"),
        severity,
        get("message") or "",
        get("id") or "",
        get("node") or "",
    )


def parse_line(text: str, line: int) -> FileEvent:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidInput(
            f"line {line}", text[:80], f"a JSON object ({err.msg} at column {err.colno})"
        ) from None
    return parse_event(obj, line)


def read_events(lines: Iterable[str]) -> Iterator[FileEvent]:
    """Parse JSON Lines lazily; line numbers are 0-based and count skipped lines too."""
    for n, raw in enumerate(lines):
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        yield parse_line(s, n)


def event_to_dict(ev: FileEvent) -> dict[str, Any]:
    out: dict[str, Any] = {"time": format_time(ev.time), "kind": ev.kind.value}
    if ev.kind == EventKind.MOVED:
        out.update({"serial": ev.serial, "from": ev.from_slot, "to": ev.to_slot})
    else:
        out["component"] = ev.component
    for key, value in (("code", ev.code), ("link", ev.link), ("severity", ev.severity)):
        if value is not None:
            out[key] = value.value if isinstance(value, Severity) else value
    for key, s in (("message", ev.message), ("id", ev.id), ("node", ev.node)):
        if s:
            out[key] = s
    return out


def format_event(ev: FileEvent) -> str:
    """One JSON line (no newline) in ``gpufleet.event/v1``."""
    return json.dumps(event_to_dict(ev), separators=(", ", ": "))


def format_time(dt: datetime) -> str:
    dt = dt.astimezone(UTC)
    if dt.microsecond:
        return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")
