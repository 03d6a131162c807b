"""``gpufleet fleet events --jsonl``: the controller's events as the correlator's input (event lines)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpufleet.cli.fleet import since_time as _since
from gpufleet.cli.fleet_events import PAGE, export, file_event
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.eventio import format_event, parse_line
from gpufleet.domain.events import EventKind

T0 = datetime(2026, 11, 28, 12, tzinfo=UTC)


def api_event(seq: int, **kw: Any) -> dict[str, Any]:
    """One ``GET /v1/events`` entry as the API answers it."""
    base = {"seq": seq, "id": f"n1:e{seq}", "node": "r01-n01", "kind": "link_error",
            "time": (T0 + timedelta(seconds=seq)).isoformat(), "component": "r01-n01-gpu0", "code": None,
            "severity": "info", "link": "r01-n01-gpu0~r01-n01-nvsw1", "message": "1 NVLink 5 error(s)",
            "source": "nvml", "attrs": {"rule": "nvlink_error_seen"}, "received": T0.isoformat(), "fault_of": None}
    return {**base, **kw}


class Pages:
    """The API's paging, newest first, over ``events``; ``arrive`` lands before the second page is read."""

    def __init__(self, events: list[dict[str, Any]], arrive: list[dict[str, Any]]) -> None:
        self.events, self.arrive, self.calls = events, arrive, 0

    def call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        assert (method, path, params["limit"]) == ("GET", "/events", PAGE)
        if self.calls == 1:
            self.events = self.arrive + self.events  # new events push the older ones down a page
        self.calls += 1
        newest = sorted(self.events, key=lambda e: -e["seq"])
        return newest[params["offset"]:params["offset"] + params["limit"]]


def test_the_export_is_every_counted_event_once_oldest_first_as_event_lines() -> None:
    events = [api_event(s) for s in range(1, PAGE + 6)]
    events[3] = api_event(4, fault_of="n1:e3")  # merged onto another source's: the correlator never counted it
    late = [api_event(PAGE + 100 + i) for i in range(3)]
    pages = Pages(events, late)
    out = export(pages, node=None, kind=None, since=None)  # type: ignore[arg-type]
    assert pages.calls >= 2
    seqs = [int(ev.id.removeprefix("n1:e")) for ev in out]
    assert seqs == sorted(set(seqs)) and 4 not in seqs  # once each, oldest first, the merged one left out
    # Every event there when the export began (events arriving meanwhile may or may not be in it).
    assert set(range(1, PAGE + 6)) - {4} <= set(seqs) <= set(range(1, PAGE + 6)) | {e["seq"] for e in late}
    assert [ev.line for ev in out] == list(range(1, len(out) + 1))
    again = parse_line(format_event(out[0]), 1)  # what gpufleet correlate --events reads back
    assert (again.kind, again.component, again.link, again.node) == (
        EventKind.LINK_ERROR, "r01-n01-gpu0", "r01-n01-gpu0~r01-n01-nvsw1", "r01-n01")


def test_a_moved_event_takes_its_serial_and_slots_from_its_attrs_and_a_bare_event_its_node() -> None:
    moved = file_event(api_event(7, kind="moved", component=None, link=None, severity=None,
                                 attrs={"serial": "TRAY-0042", "from": "r01-ct03", "to": "r01-ct05"}), 1)
    assert (moved.kind, moved.serial, moved.from_slot, moved.to_slot, moved.component) == (
        EventKind.MOVED, "TRAY-0042", "r01-ct03", "r01-ct05", "")
    assert parse_line(format_event(moved), 1).to_slot == "r01-ct05"
    bare = file_event(api_event(8, component=None, link=None, kind="heartbeat_lost"), 2)
    assert bare.component == "r01-n01"


def test_since_is_a_zoned_time_or_how_long_ago() -> None:
    assert _since("2026-11-28T12:00:00Z") == T0.isoformat()
    ago = datetime.fromisoformat(_since("2h"))
    assert timedelta(hours=2) - timedelta(minutes=1) < datetime.now(UTC) - ago < timedelta(hours=2, minutes=1)
    for bad in ("2026-11-28T12:00:00", "yesterday"):
        with pytest.raises(InvalidInput) as err:
            _since(bad)
        assert err.value.field == "--since" and err.value.value == bad
