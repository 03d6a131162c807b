from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpufleet.agent.spool import Spool
from gpufleet.controller.api.schemas import EventIn
from gpufleet.domain import wire
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent, Severity

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def ev(i: int, severity: Severity | None = Severity.DEGRADED) -> HealthEvent:
    return HealthEvent(
        id=f"e{i}",
        node="n1",
        kind=EventKind.THERMAL,
        time=T0 + timedelta(seconds=i),
        component="n1-gpu0",
        severity=severity,
        message=f"event {i}",
        attrs=(("k", "v"),),
    )


def test_put_peek_ack_roundtrip(tmp_path: Path) -> None:
    s = Spool(tmp_path / "s.db")
    assert s.put([ev(1), ev(2), ev(3)]) == 3
    batch = s.peek(2)
    assert [EventIn.model_validate(json.loads(b)).id for _, b in batch] == ["e1", "e2"]
    assert EventIn.model_validate(json.loads(batch[0][1])).to_domain() == ev(1)
    s.ack([q for q, _ in batch])
    assert len(s) == 1 and [json.loads(b)["id"] for _, b in s.peek(10)] == ["e3"]


def test_duplicates_are_stored_once(tmp_path: Path) -> None:
    s = Spool(tmp_path / "s.db")
    assert s.put([ev(1), ev(1), ev(2)]) == 2
    assert s.put([ev(2)]) == 0
    assert len(s) == 2


def test_survives_reopen(tmp_path: Path) -> None:
    s = Spool(tmp_path / "s.db")
    s.put([ev(i) for i in range(5)])
    s.ack([q for q, _ in s.peek(2)])
    s.close()
    again = Spool(tmp_path / "s.db")
    assert len(again) == 3 and [json.loads(b)["id"] for _, b in again.peek(10)] == ["e2", "e3", "e4"]


def test_the_standing_conditions_are_kept_with_the_events_and_survive_reopen(tmp_path: Path) -> None:
    s = Spool(tmp_path / "s.db")
    assert s.armed("boot=b1") == frozenset()  # also: what is stored from now on was seen on boot b1
    assert s.put([ev(1)], {"remap_failure:n1-gpu1", "up:n1-gpu0:nvlink3"}) == 1
    assert s.put([ev(2)]) == 1  # events alone leave the conditions as they were
    s.close()
    again = Spool(tmp_path / "s.db")
    assert again.armed("boot=b1") == {"remap_failure:n1-gpu1", "up:n1-gpu0:nvlink3"} and len(again) == 2
    assert again.put((), {"up:n1-gpu0:nvlink3"}) == 0  # a condition cleared, no event: stored all the same
    again.close()
    assert Spool(tmp_path / "s.db").armed("boot=b1") == {"up:n1-gpu0:nvlink3"}


def test_edges_kept_on_another_boot_or_hardware_are_not_restored(tmp_path: Path) -> None:
    s = Spool(tmp_path / "s.db")
    s.armed("boot=b1;gpus=u0")
    s.put([ev(1)], {"remap_failure:n1-gpu0"})
    assert Spool(tmp_path / "s.db").armed("boot=b2;gpus=u0") == frozenset(), "rebooted: everything afresh"
    assert Spool(tmp_path / "s.db").armed("boot=b1;gpus=u9") == frozenset(), "another board"
    assert Spool(tmp_path / "s.db").armed("") == frozenset(), "no boot id: nothing kept"
    unknown = Spool(tmp_path / "s2.db")
    unknown.armed("")
    unknown.put([ev(1)], {"remap_failure:n1-gpu0"})
    assert Spool(tmp_path / "s2.db").armed("") == frozenset()


def test_a_failed_put_keeps_neither_its_events_nor_its_conditions(tmp_path: Path) -> None:
    s = Spool(tmp_path / "s.db")
    s.armed("boot=b1")
    s.put([ev(1)], {"a"})
    s._db.execute("CREATE TRIGGER no_b BEFORE INSERT ON armed WHEN NEW.key = 'b' BEGIN SELECT RAISE(ABORT, 'x'); END")
    with pytest.raises(Exception, match="x"):
        s.put([ev(2)], {"b"})
    assert s.armed("boot=b1") == {"a"} and [json.loads(b)["id"] for _, b in s.peek(10)] == ["e1"] and len(s) == 1


def test_bounded_evicts_routine_kinds_first(tmp_path: Path) -> None:
    """Thermal excursions are routine (they come in floods); a stated-fatal one and rare fault kinds stay."""
    s = Spool(tmp_path / "s.db", max_events=4)
    s.put([ev(0, Severity.FATAL), ev(1), ev(2, Severity.FATAL), ev(3)])
    s.put([ev(4), ev(5)])
    ids = [json.loads(b)["id"] for _, b in s.peek(10)]
    assert ids == ["e0", "e2", "e4", "e5"] and s.dropped == 2
    s.put([ev(6, Severity.FATAL), ev(7, Severity.FATAL), ev(8, Severity.FATAL)])
    ids = [json.loads(b)["id"] for _, b in s.peek(10)]
    assert ids == ["e2", "e6", "e7", "e8"] and s.dropped == 5
    s.close()
    assert Spool(tmp_path / "s.db", max_events=4).dropped == 5
    s2 = Spool(tmp_path / "s2.db", max_events=2)
    xid = HealthEvent("x1", "n1", EventKind.XID, T0, "n1-gpu0", 79)  # no severity stated: kept by its kind
    s2.put([xid, ev(1, None), ev(2, None)])
    assert [json.loads(b)["id"] for _, b in s2.peek(10)] == ["x1", "e2"]


def test_rejects_bad_bound(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"spool\.max_events"):
        Spool(tmp_path / "s.db", max_events=0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "ack"]), st.integers(0, 6)), max_size=25))
def test_fifo_model(tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]]) -> None:
    s = Spool(tmp_path_factory.mktemp("spool") / "s.db", max_events=1000)
    model: list[str] = []
    n = 0
    for op, k in ops:
        if op == "put":
            batch = [ev(n + i) for i in range(k)]
            n += k
            s.put(batch)
            model += [e.id for e in batch]
        else:
            got = s.peek(k)
            assert [json.loads(b)["id"] for _, b in got] == model[:k]
            s.ack([q for q, _ in got])
            model = model[len(got) :]
        assert len(s) == len(model)
    s.close()


def test_the_spooled_wire_form_is_what_the_controller_validates() -> None:
    good = wire.to_wire(ev(1))
    for field, value, want in [
        ("kind", "bogus", "kind"),
        ("time", "2026-11-21T12:00:00", "time"),
        ("severity", "meh", "severity"),
        ("id", "", "id"),
        ("code", "79", "code"),
    ]:
        bad = dict(good)
        bad[field] = value  # type: ignore[literal-required]
        with pytest.raises(ValidationError) as err:
            EventIn.model_validate(bad)
        assert [e["loc"][0] for e in err.value.errors()] == [want]
