"""Times: aware datetimes round-trip as the same instant in UTC; naive ones are refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import StatementError

from gpufleet.controller.store.repo import Store
from gpufleet.domain.events import EventKind
from gpufleet.lifecycle.plan import Plan
from tests.integration.store.plans import T0, event, node_record

IST = timezone(timedelta(hours=5, minutes=30))
PST = timezone(timedelta(hours=-8))


def test_aware_times_round_trip_as_utc(engine: Engine) -> None:
    store = Store(engine)
    at = datetime(2026, 11, 21, 17, 45, 1, 123456, tzinfo=IST)  # 12:15:01.123456 UTC
    received = datetime(2026, 11, 21, 4, 15, 2, 999999, tzinfo=PST)  # 12:15:02.999999 UTC
    store.commit(Plan(), new_nodes=[(node_record("r01-n01"), "r01", at)],
                 events=[event("e1", at=at)], received=received)
    (row,) = store.events()
    assert row.time == at
    assert row.time.utcoffset() == timedelta(0)
    assert (row.time.hour, row.time.minute, row.time.microsecond) == (12, 15, 123456)
    assert row.received == received
    assert row.received.utcoffset() == timedelta(0)
    node = store.node("r01-n01")
    assert node is not None
    assert node.registered == at
    assert node.registered.tzinfo is not None
    (loaded,) = store.events_since(at - timedelta(seconds=1))
    assert loaded.time == at
    assert loaded.time.utcoffset() == timedelta(0)


def test_filters_and_order_compare_instants_not_wall_clock_text(engine: Engine) -> None:
    """Events given in different offsets sort and filter by the instant they name."""
    store = Store(engine)
    # By wall-clock text e-ist (17:00+05:30) looks latest and e-pst (05:00-08:00) earliest; as instants
    # e-ist is 11:30Z, e-utc 12:00Z, e-pst 13:00Z.
    events = [event("e-ist", at=datetime(2026, 11, 21, 17, 0, tzinfo=IST), kind=EventKind.ECC_SBE, code=None),
              event("e-utc", at=datetime(2026, 11, 21, 12, 0, tzinfo=UTC), kind=EventKind.ECC_SBE, code=None),
              event("e-pst", at=datetime(2026, 11, 21, 5, 0, tzinfo=PST), kind=EventKind.ECC_SBE, code=None)]
    store.commit(Plan(), new_nodes=[(node_record("r01-n01"), "r01", T0)], events=events, received=T0)
    assert [r.id for r in store.events()] == ["e-pst", "e-utc", "e-ist"]
    since = datetime(2026, 11, 21, 7, 45, tzinfo=timezone(timedelta(hours=-4)))  # 11:45Z
    assert [e.id for e in store.events_since(since)] == ["e-utc", "e-pst"]
    assert [r.id for r in store.events(since=since)] == ["e-pst", "e-utc"]


def test_a_naive_time_is_refused(engine: Engine) -> None:
    store = Store(engine)
    store.commit(Plan(), new_nodes=[(node_record("r01-n01"), "r01", T0)])
    with pytest.raises(StatementError, match="naive datetime"):
        store.retry_action("nope", datetime(2026, 11, 21, 12, 0), "operator:alice")
    assert store.audit() == []
