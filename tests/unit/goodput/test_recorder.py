"""The recorder API and the JSON Lines timeline format."""

from __future__ import annotations

import pytest

from gpufleet.domain.errors import InvalidInput
from gpufleet.goodput.recorder import Recorder, parse_jsonl, to_jsonl
from gpufleet.goodput.timeline import TimelineEventKind as K


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_recorder_builds_a_timeline_that_accounts_like_a_hand_count() -> None:
    clock = FakeClock()
    rec = Recorder(clock)
    rec.start()
    clock.now = 30
    rec.initialised()
    clock.now = 630
    rec.checkpoint_start(1)
    clock.now = 632
    rec.checkpoint_end(1)
    clock.now = 700
    rec.checkpoint_persisted(1)
    clock.now = 900
    rec.failure("gpu_hbm3")
    clock.now = 960
    rec.start()
    clock.now = 990
    rec.initialised()
    clock.now = 1590
    rec.end()
    kinds = [e.kind for e in rec.timeline().events]
    assert kinds[0] is K.START and kinds[6] is K.RESTART
    r = rec.report()
    # Training 600 s, then 268 s after the snapshot (lost), then 600 s after the restart.
    assert r.productive == 1200
    assert r.badput.lost_progress == 268
    assert r.badput.startup == 60
    assert r.badput.waiting == 60
    assert r.interruptions.by_cause == (("gpu_hbm3", 1),)


def test_recorder_rejects_a_clock_going_back() -> None:
    clock = FakeClock()
    rec = Recorder(clock)
    clock.now = 10
    rec.start()
    clock.now = 5
    with pytest.raises(InvalidInput) as err:
        rec.end()
    assert err.value.field == "clock"


def test_jsonl_round_trip_and_iso_times() -> None:
    clock = FakeClock()
    rec = Recorder(clock)
    rec.start()
    clock.now = 12.5
    rec.step(1)
    clock.now = 20
    rec.failure("nic")
    tl = rec.timeline()
    assert parse_jsonl(to_jsonl(tl)) == tl
    iso = parse_jsonl('{"time": "2026-11-21T12:00:00Z", "kind": "start"}\n'
                      '{"time": "2026-11-21T13:00:00+00:00", "kind": "end"}\n')
    assert [e.time for e in iso.events] == [0.0, 3600.0]


@pytest.mark.parametrize(("text", "field"), [
    ('{"time": 1, "kind": "launch"}', "t:1.kind"),
    ('{"time": 1, "kind": "start", "color": "red"}', "t:1.color"),
    ('{"time": "noon", "kind": "start"}', "t:1.time"),
    ('{"time": 1, "kind": "start", "checkpoint": "a"}', "t:1.checkpoint"),
    ("not json", "t:1"),
])
def test_jsonl_errors_name_the_line_and_field(text: str, field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_jsonl(text, "t")
    assert err.value.field == field
