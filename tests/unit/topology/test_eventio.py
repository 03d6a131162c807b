"""``gpufleet.event/v1`` parsing: the DESIGN examples parse; bad lines name line, field and value."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.eventio import FileEvent, format_event, parse_line, read_events
from gpufleet.domain.events import EventKind

DESIGN_EXAMPLES = [
    '{"time": "2026-11-21T12:00:03Z", "kind": "xid", "component": "r01-n03-gpu5", "code": 79}',
    '{"time": "2026-11-21T12:00:04Z", "kind": "link_error", "component": "r01-n03-nic5", '
    '"link": "r01-n03-nic5~leaf-su1-r5"}',
    '{"time": "2026-11-21T13:00:00Z", "kind": "moved", "serial": "TRAY-0042", "from": "r01-ct03", '
    '"to": "r02-ct07"}',
]


def test_design_examples_parse() -> None:
    evs = list(read_events(["# a comment", *DESIGN_EXAMPLES, ""]))
    assert [e.line for e in evs] == [2, 3, 4]  # 1-based; line 1 is the comment
    xid, link, moved = evs
    assert xid.kind is EventKind.XID and xid.code == 79 and xid.component == "r01-n03-gpu5"
    assert xid.time == datetime(2026, 11, 21, 12, 0, 3, tzinfo=UTC)
    assert link.link == "r01-n03-nic5~leaf-su1-r5"
    assert (moved.serial, moved.from_slot, moved.to_slot) == ("TRAY-0042", "r01-ct03", "r02-ct07")


@pytest.mark.parametrize(
    ("line", "field", "value"),
    [
        ('{"time": "2026-11-21T12:00:03Z", "kind": "xidd", "component": "g"}', "line 7: kind", "xidd"),
        (
            '{"time": "2026-11-21T12:00:03", "kind": "xid", "component": "g", "code": 1}',
            "line 7: time",
            "2026-11-21T12:00:03",
        ),
        ('{"time": "yesterday", "kind": "xid", "component": "g", "code": 1}', "line 7: time", "yesterday"),
        ('{"time": "2026-11-21T12:00:03Z", "kind": "xid", "component": "g"}', "line 7: code", None),
        (
            '{"time": "2026-11-21T12:00:03Z", "kind": "xid", "component": "g", "code": "79"}',
            "line 7: code",
            "79",
        ),
        ('{"time": "2026-11-21T12:00:03Z", "kind": "ecc_dbe"}', "line 7: component", None),
        ('{"time": "2026-11-21T12:00:03Z", "kind": "moved", "serial": "S", "to": "b"}', "line 7: from", None),
        (
            '{"time": "2026-11-21T12:00:03Z", "kind": "thermal", "component": "g", "temp": 99}',
            "line 7: temp",
            99,
        ),
        ("[1, 2]", "line 7", [1, 2]),
    ],
)
def test_bad_line_names_line_field_and_value(line: str, field: str, value: object) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_line(line, 7)
    assert err.value.field == field
    assert err.value.value == value


def test_invalid_json_names_the_line() -> None:
    with pytest.raises(InvalidInput) as err:
        list(
            read_events(
                ['{"time": "2026-11-21T12:00:03Z", "kind": "xid", "component": "g", "code": 1}', "{oops"]
            )
        )
    assert err.value.field == "line 2"
    assert "JSON" in err.value.expected


_kinds = st.sampled_from([k for k in EventKind if k is not EventKind.MOVED])
_ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-~", min_size=1, max_size=20)


@given(
    kind=_kinds,
    comp=_ids,
    code=st.integers(0, 200_000),
    link=st.none() | _ids,
    when=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)),
)
def test_format_then_parse_is_identity(
    kind: EventKind, comp: str, code: int, link: str | None, when: datetime
) -> None:
    ev = FileEvent(line=0, time=when, kind=kind, component=comp, code=code, link=link)
    assert parse_line(format_event(ev), 0) == ev
