"""The ``gpufleet.event/v1`` fast path accepts and refuses exactly what the strict path does.

``parse_line`` tries the fast path and falls back to the strict one; ``parse_line_strict`` is the
strict path alone (json.loads, then full validation). On generated lines, valid and not, both must
give the same event or the same error (field, value, expectation). Separate tests make sure the
fast path really takes the common lines (else the equality would hold trivially).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.eventio import (
    FileEvent,
    _fast_fields,
    format_event,
    line_fields,
    parse_line,
    parse_line_strict,
    read_event_fields,
    read_events,
)
from gpufleet.domain.events import EventKind, Severity


def _outcome(parse: Any, text: str, line: int) -> tuple[object, ...]:
    try:
        ev = parse(text, line)
    except InvalidInput as err:
        return ("refused", err.field, repr(err.value), err.expected)
    return ("accepted", ev)


_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-~", min_size=1, max_size=12)
_odd_text = st.text(max_size=8)  # any Unicode: quotes, backslashes, control characters, surrogates...
_times = st.one_of(
    st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)).map(
        lambda d: d.isoformat().replace("+00:00", "Z")
    ),
    st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2100, 1, 1)).map(datetime.isoformat),  # naive
    st.sampled_from(
        [
            "2026-11-21T12:00:03+00:00",
            "2026-11-21T12:00:03+02:00",
            "2026-11-21T12:00:03.5-05:30",
            "2026-11-21 12:00:03Z",
            "2026-11-21",
            "2026-13-01T00:00:00Z",
            "yesterday",
            "",
        ]
    ),
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    _odd_text,
    st.just(""),
)
_junk = st.one_of(_scalars, st.lists(st.integers(), max_size=2), st.dictionaries(_names, st.integers(), max_size=1))
_utc_times = st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2100, 1, 1), timezones=st.just(UTC))
# Per field: values a producer would plausibly write (valid or nearly), and junk of any JSON type.
_PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "time": st.one_of(_utc_times.map(lambda d: d.isoformat().replace("+00:00", "Z")), _times),
    "kind": st.one_of(st.sampled_from([k.value for k in EventKind]), st.sampled_from(["XID", "xidd", ""])),
    "component": _names,
    "code": st.one_of(st.integers(0, 200_000), st.integers(-5, -1), st.just(2**70)),
    "link": _names,
    "serial": _names,
    "from": _names,
    "to": _names,
    "severity": st.one_of(st.sampled_from([s.value for s in Severity]), st.just("FATAL")),
    "message": _odd_text,
    "id": _names,
    "node": _names,
    "temp": _junk,  # not a field of the format
}
_COMMON = ("time", "kind", "component")


@st.composite
def _objects(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly plausible events: usually time, kind and component, a few other keys in any order,
    each value plausible four times in five and junk (null, wrong type, empty) otherwise."""
    keys = list(_COMMON) if draw(st.integers(0, 5)) else []
    keys += draw(st.lists(st.sampled_from(sorted(_PLAUSIBLE)), max_size=4))
    keys = list(dict.fromkeys(draw(st.permutations(keys))))
    return {k: draw(_PLAUSIBLE[k]) if draw(st.integers(0, 4)) else draw(_junk) for k in keys}


@st.composite
def _lines(draw: st.DrawFn) -> str:
    """A line as a producer might write it: JSON objects in any key order and spacing, and damaged text."""
    shape = draw(st.integers(0, 9))
    if shape == 0:  # not an object at all
        return json.dumps(draw(_junk))
    obj = draw(_objects())
    text = json.dumps(obj, separators=draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " :  ")])))
    if shape == 1:  # damaged: cut, extra data, a byte-order mark, surrounding whitespace, escapes
        how = draw(st.integers(0, 4))
        if how == 0:
            return text[: draw(st.integers(0, len(text)))]
        if how == 1:
            return text + draw(st.sampled_from(["}", " x", "{}", ",", " \t"]))
        if how == 2:
            return "\ufeff" + text
        if how == 3:
            return draw(st.sampled_from([" ", "\t", "\r"])) + text
        return json.dumps(obj, ensure_ascii=True)
    return text


_VALID_KINDS = [k for k in EventKind if k is not EventKind.MOVED]


@st.composite
def _valid_objects(draw: st.DrawFn) -> dict[str, Any]:
    """Well-formed non-moved events in UTC: the lines the fast path exists for."""
    kind = draw(st.sampled_from(_VALID_KINDS))
    when = draw(st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)))
    obj: dict[str, Any] = {"time": when.isoformat().replace("+00:00", "Z"), "kind": kind.value}
    obj["component"] = draw(_names)
    if kind in (EventKind.XID, EventKind.SXID) or draw(st.booleans()):
        obj["code"] = draw(st.integers(0, 2**40))
    for key in ("link", "message", "id", "node"):
        if draw(st.booleans()):
            obj[key] = draw(st.none() | _names)
    if draw(st.booleans()):
        obj["severity"] = draw(st.sampled_from([s.value for s in Severity]))
    return dict(sorted(obj.items(), key=lambda _: draw(st.integers(0, 9))))


@settings(max_examples=2000)
@given(text=_lines(), line=st.integers(0, 10**6))
@example(text='{"time": "2026-11-21T12:00:03Z", "kind": [1], "component": "g"}', line=3)
@example(text='{"time": "2026-11-21T12:00:03Z", "kind": "xid", "component": "g", "code": 1, "severity": {}}', line=3)
@example(text='{"time": "2026-11-21T12:00:03Z", "kind": "xid", "component": "g", "code": true}', line=3)
@example(text='{"time": "2026-11-21T12:00:03Z", "kind": "xid", "component": "g", "code": 1, "severity": null}', line=3)
@example(text='{"time": "2026-11-21T12:00:03+01:00", "kind": "ecc_sbe", "component": "g"}', line=3)
@example(text='{"time": "2026-11-21T12:00:03Z", "kind": "ecc_sbe", "component": "g", "code": -1}', line=3)
@example(text='{"time": "2026-11-21T12:00:03Z", "kind": "ecc_sbe", "component": "g", "severity": "FATAL"}', line=3)
@example(text='{"time": "2026-11-21T12:00:03Z", "kind": "ecc_sbe", "component": "g"} ', line=3)
@example(text=' {"time": "2026-11-21T12:00:03Z", "kind": "ecc_sbe", "component": "g"}', line=3)
def test_fast_and_strict_paths_agree_on_any_line(text: str, line: int) -> None:
    strict = _outcome(parse_line_strict, text, line)
    assert _outcome(parse_line, text, line) == strict
    assert _outcome(lambda t, n: FileEvent(*line_fields(t, n)), text, line) == strict


@settings(max_examples=500)
@given(obj=_valid_objects(), line=st.integers(0, 10**6), compact=st.booleans())
def test_fast_path_takes_well_formed_events_and_agrees(obj: dict[str, Any], line: int, compact: bool) -> None:
    fields = _fast_fields(obj, line)
    assert fields is not None, "the fast path should take this line itself"
    text = json.dumps(obj, separators=(",", ":") if compact else (", ", ": "))
    assert FileEvent(*fields) == parse_line_strict(text, line)


def test_fast_path_takes_what_format_event_writes() -> None:
    ev = FileEvent(
        line=4, time=datetime(2026, 11, 21, 12, 0, 3, 250, tzinfo=UTC), kind=EventKind.XID, component="g1", code=79
    )
    fields = _fast_fields(json.loads(format_event(ev)), 4)
    assert fields is not None and FileEvent(*fields) == ev


@pytest.mark.parametrize(
    "obj",
    [
        {"time": "2026-11-21T13:00:00Z", "kind": "moved", "serial": "S", "from": "a", "to": "b"},
        {"time": "2026-11-21T12:00:03+02:00", "kind": "ecc_sbe", "component": "g"},
        {"time": "2026-11-21T12:00:03Z", "kind": "xid", "component": "g"},
        {"time": "2026-11-21T12:00:03Z", "kind": "ecc_sbe", "component": "g", "temp": 3},
        {"time": "2026-11-21T12:00:03Z", "kind": "ecc_sbe", "component": ""},
        {"time": "2026-11-21T12:00:03Z", "kind": ["xid"], "component": "g"},
        {"time": "2026-11-21T12:00:03Z", "kind": "ecc_sbe", "component": "g", "severity": None},
        {"time": "2026-11-21T12:00:03Z", "kind": "ecc_sbe", "component": "g", "severity": "FATAL"},
        {"time": "2026-11-21T12:00:03Z", "kind": "ecc_sbe", "component": "g", "code": -1},
        {"time": "2026-11-21T12:00:03Z", "kind": "ecc_sbe", "component": "g", "link": 5},
        {"time": "2026-11-21T12:00:03Z", "kind": "ecc_sbe", "component": "g", "node": ["n"]},
    ],
)
def test_fast_path_declines_what_it_does_not_check(obj: dict[str, Any]) -> None:
    assert _fast_fields(obj, 0) is None


def test_converted_zones_go_the_strict_way_to_the_same_instant() -> None:
    ev = parse_line('{"time": "2026-11-21T14:00:03+02:00", "kind": "ecc_sbe", "component": "g"}', 0)
    assert ev.time == datetime(2026, 11, 21, 12, 0, 3, tzinfo=UTC) and ev.time.tzinfo is UTC


@pytest.mark.parametrize(
    ("line", "field", "value", "expected_part"),
    [
        ('{"time": "2026-11-21T12:00:03Z", "kind": [1], "component": "g"}', "line 5: kind", [1], "one of"),
        (
            '{"time": "2026-11-21T12:00:03Z", "kind": "xid", "component": "g", "code": 1, "severity": {}}',
            "line 5: severity",
            {},
            "one of",
        ),
        ("[" * 100_000 + "]" * 100_000, "line 5", "[" * 80, "nested too deeply"),
        ('{"code": ' + "7" * 5000 + "}", "line 5", '{"code": ' + "7" * 71, "a JSON object"),
    ],
)
def test_odd_values_are_refused_with_a_clear_error(line: str, field: str, value: object, expected_part: str) -> None:
    for parse in (parse_line, parse_line_strict):
        with pytest.raises(InvalidInput) as err:
            parse(line, 5)
        assert err.value.field == field
        assert err.value.value == value
        assert expected_part in err.value.expected


def test_read_event_fields_matches_read_events_and_keeps_line_numbers() -> None:
    lines = [
        "# header",
        '{"time": "2026-11-21T12:00:03Z", "kind": "xid", "component": "r01-n03-gpu5", "code": 79}',
        "",
        '{"time": "2026-11-21T13:00:00Z", "kind": "moved", "serial": "T", "from": "r01-ct03", "to": "r02-ct07"}',
        '  {"time": "2026-11-21T12:00:04Z", "kind": "link_error", "component": "c", "link": "c~d"}  \n',
    ]
    fields = list(read_event_fields(lines))
    assert [FileEvent(*f) for f in fields] == list(read_events(lines))
    assert [f[0] for f in fields] == [2, 4, 5]
    assert fields[1][2] is EventKind.MOVED and fields[1][6:9] == ("T", "r01-ct03", "r02-ct07")
    with pytest.raises(InvalidInput) as err:
        list(read_event_fields([*lines, '{"time": "2026-11-21T12:00:05Z", "kind": "xid", "component": "g"}']))
    assert err.value.field == "line 6: code"  # the sixth line, 1-based
