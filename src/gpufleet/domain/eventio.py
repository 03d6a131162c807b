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

Two paths, one result. The *fast path* (:func:`_fast_fields`) accepts only lines it can check cheaply
(a non-``moved`` event whose time is in UTC and whose keys and values are plainly valid) and declines
everything else; a declined line goes through the *strict path* (:func:`parse_event`), which accepts
the rest and produces every error. For any line both give the same event or the fast path declines
(``tests/unit/topology/test_eventio_fastpath.py`` checks this on generated valid and invalid lines).
:func:`read_event_fields` yields an event as a plain tuple of :class:`FileEvent`'s fields, which the
correlation engine consumes without building a :class:`FileEvent` per line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from json.scanner import make_scanner
from typing import Any, cast

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
# The fast path: every kind but ``moved`` (whose three extra fields go the strict way), these keys.
_FAST_KINDS: dict[str, EventKind] = {k: v for k, v in _KINDS.items() if v is not EventKind.MOVED}
_FAST_BASE = frozenset({"time", "kind", "component", "code", "link"})
_FAST_KEYS = _FAST_BASE | {"severity", "message", "id", "node"}
# json.loads's own scanner (C), called without json.loads's two layers of Python wrappers: for a line
# that starts with '{' and is decoded to its end, the same object json.loads returns.
_SCAN = make_scanner(cast(Any, json.JSONDecoder()))
_TIME_EXPECTED = "an ISO-8601 time with a zone, e.g. 2026-11-21T12:00:03Z"

#: A :class:`FileEvent`'s fields in its field order (``FileEvent(*fields)`` builds it): ``line, time,
#: kind, component, code, link, serial, from_slot, to_slot, severity, message, id, node``.
EventFields = tuple[
    int,
    datetime,
    EventKind,
    str,
    int | None,
    str | None,
    str | None,
    str | None,
    str | None,
    Severity | None,
    str,
    str,
    str,
]


@dataclass(frozen=True, slots=True)
class FileEvent:
    """One ``gpufleet.event/v1`` line. ``line`` is its 1-based line number (the verdicts' evidence)."""

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
        raise InvalidInput(field, value, _TIME_EXPECTED)
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInput(field, value, _TIME_EXPECTED) from None
    if dt.tzinfo is UTC:
        return dt
    if dt.tzinfo is None:
        raise InvalidInput(field, value, "a time with a zone (Z or +hh:mm)")
    return dt.astimezone(UTC)


def parse_event(obj: Any, line: int = 0) -> FileEvent:
    """Validate one decoded JSON object into a :class:`FileEvent` (the strict path)."""
    return FileEvent(*_strict_fields(obj, line))


def _strict_fields(obj: Any, line: int) -> EventFields:
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
    raw_kind = get("kind")
    kind = _KINDS.get(raw_kind) if type(raw_kind) is str else None
    if kind is None:
        raise InvalidInput(f"line {line}: kind", raw_kind, f"one of {sorted(_KINDS)}")
    time = parse_time(get("time"), f"line {line}: time")
    severity = None
    if "severity" in obj:
        raw_sev = obj["severity"]
        severity = _SEVERITIES.get(raw_sev) if type(raw_sev) is str else None
        if severity is None:
            raise InvalidInput(f"line {line}: severity", raw_sev, f"one of {sorted(_SEVERITIES)}")
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
    return (
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


def _fast_fields(obj: dict[str, Any], line: int) -> EventFields | None:
    """The fields of a plainly valid non-``moved`` event in UTC, or None: then ask the strict path.

    Never raises and never accepts what :func:`_strict_fields` refuses (an unhashable value, a time
    that does not parse, ... all mean "not for me")."""
    get = obj.get
    try:
        kind = _FAST_KINDS.get(get("kind"))  # type: ignore[arg-type]
        comp = get("component")
        t = get("time")
        if kind is None or type(comp) is not str or not comp or type(t) is not str:
            return None
        time = datetime.fromisoformat(t)
    except (TypeError, ValueError):
        return None
    if time.tzinfo is not UTC:
        return None
    code = get("code")
    if code is None:
        if kind in _CODED:
            return None
    elif type(code) is not int or code < 0:
        return None
    link = get("link")
    if link is not None and type(link) is not str:
        return None
    keys = obj.keys()
    if keys <= _FAST_BASE:
        return (line, time, kind, comp, code, link, None, None, None, None, "", "", "")
    if not keys <= _FAST_KEYS:
        return None
    severity = None
    if "severity" in obj:
        raw_sev = obj["severity"]
        if type(raw_sev) is not str:
            return None
        severity = _SEVERITIES.get(raw_sev)
        if severity is None:
            return None
    message, ident, node = get("message"), get("id"), get("node")
    for v in (message, ident, node):
        if v is not None and type(v) is not str:
            return None
    return (line, time, kind, comp, code, link, None, None, None, severity, message or "", ident or "", node or "")


def _loads(text: str, line: int) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidInput(
            f"line {line}", text[:80], f"a JSON object ({err.msg} at column {err.colno})"
        ) from None
    except ValueError as err:  # e.g. an integer of more than 4,300 digits
        raise InvalidInput(f"line {line}", text[:80], f"a JSON object ({err})") from None
    except RecursionError:
        raise InvalidInput(f"line {line}", text[:80], "a JSON object (nested too deeply)") from None


def line_fields(text: str, line: int) -> EventFields:
    """One JSON line's event as :data:`EventFields`: the fast path, else the strict path."""
    try:
        obj, end = _SCAN(text, 0)
    except (StopIteration, ValueError, RecursionError):  # not JSON (or not at column 1): json.loads decides
        obj, end = None, -1
    if end == len(text) and type(obj) is dict:
        fields = _fast_fields(obj, line)
        return fields if fields is not None else _strict_fields(obj, line)
    return _strict_fields(_loads(text, line), line)


def parse_line(text: str, line: int) -> FileEvent:
    return FileEvent(*line_fields(text, line))


def parse_line_strict(text: str, line: int) -> FileEvent:
    """:func:`parse_line` without the fast path (the reference the fast path is tested against)."""
    return FileEvent(*_strict_fields(_loads(text, line), line))


def read_event_fields(lines: Iterable[str]) -> Iterator[EventFields]:
    """Parse JSON Lines lazily into :data:`EventFields`; line numbers are 1-based (as an editor and
    ``gpufleet diagnose`` count them) and count skipped lines too. ``FileEvent(*fields)`` is what
    :func:`read_events` yields for the same line."""
    for n, raw in enumerate(lines, start=1):
        s = raw.strip()
        if s and s[0] != "#":
            yield line_fields(s, n)


def read_events(lines: Iterable[str]) -> Iterator[FileEvent]:
    """Parse JSON Lines lazily; line numbers are 1-based and count skipped lines too."""
    for fields in read_event_fields(lines):
        yield FileEvent(*fields)


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
