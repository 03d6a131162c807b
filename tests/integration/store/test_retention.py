"""Event retention on both databases: old events deleted oldest first in bounded batches, archived
first when asked, new ones and everything else kept; a horizon shorter than the policy reads is refused."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.retention import Retention, check_horizon
from gpufleet.controller.runtime import build
from gpufleet.controller.settings import ControllerSettings, RetentionSettings
from gpufleet.controller.store.models import CheckpointRow, EventRow
from gpufleet.controller.store.repo import Store
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.lifecycle.plan import Plan
from gpufleet.schedulers.sim import SimScheduler

T0 = datetime(2026, 11, 1, tzinfo=UTC)
KEEP = timedelta(days=30)


def _store_events(store: Store, n: int, received: datetime, tag: str) -> None:
    events = [HealthEvent(f"{tag}-{i}", f"n{i % 3}", EventKind.XID, received - timedelta(seconds=5), f"n{i % 3}-gpu0",
                          13, message=tag) for i in range(n)]
    store.commit(Plan(), events=events, received=received)


def _ids(store: Store) -> list[str]:
    with store.session() as s:
        return list(s.scalars(select(EventRow.id).order_by(EventRow.seq)))


def test_old_events_go_oldest_first_archived_and_new_ones_stay(engine: Engine, tmp_path: Path) -> None:
    store = Store(engine)
    _store_events(store, 7, T0, "old")  # 40 days before "now"
    _store_events(store, 4, T0 + timedelta(days=9), "older-than-30d")
    _store_events(store, 5, T0 + timedelta(days=20), "new")  # 20 days old at "now": kept
    clock = ManualClock(T0 + timedelta(days=40))
    archive = tmp_path / "archive"
    r = Retention(store, clock, KEEP, batch=3, archive_dir=archive)
    assert r.run_once() == 11
    assert _ids(store) == [f"new-{i}" for i in range(5)]
    lines = []
    for f in sorted(archive.glob("events-*.jsonl.gz")):
        with gzip.open(f, "rt") as fh:  # one gzip member per batch, read as one stream
            lines += [json.loads(x) for x in fh.read().splitlines()]
    expected = [f"old-{i}" for i in range(7)] + [f"older-than-30d-{i}" for i in range(4)]
    assert sorted(d["id"] for d in lines) == sorted(expected)
    assert {p.name for p in archive.iterdir()} == {"events-2026-11-01.jsonl.gz", "events-2026-11-10.jsonl.gz"}
    assert all(d["kind"] == "xid" and d["code"] == 13 and d["node"].startswith("n") for d in lines)
    assert r.deleted == 11 and r.archived == 11
    assert r.run_once() == 0  # nothing more to do


def test_a_backlog_is_worked_off_over_several_bounded_runs(engine: Engine) -> None:
    store = Store(engine)
    _store_events(store, 25, T0, "old")
    _store_events(store, 2, T0 + timedelta(days=39), "new")
    r = Retention(store, ManualClock(T0 + timedelta(days=40)), KEEP, batch=4, max_batches=3)
    seen: list[tuple[int, int]] = []
    r.on_run.append(lambda d, a: seen.append((d, a)))
    assert r.run_once() == 12  # 3 batches of 4
    assert r.run_once() == 12
    assert r.run_once() == 1
    assert seen == [(12, 0), (12, 0), (1, 0)]
    with store.session() as s:
        assert s.scalar(select(func.count()).select_from(EventRow)) == 2


def test_a_horizon_shorter_than_the_policy_reads_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as err:
        check_horizon(timedelta(days=3), timedelta(hours=24))
    assert err.value.field == "retention.events" and "7d" in err.value.expected
    with pytest.raises(InvalidInput) as err:
        check_horizon(timedelta(days=10), timedelta(days=14))  # an escalation window of 14 days
    assert "14d" in err.value.expected
    check_horizon(timedelta(days=14), timedelta(days=14))
    settings = ControllerSettings(database_url=f"sqlite:///{tmp_path / 'c.db'}", scheduler="sim",
                                  retention=RetentionSettings(events="2d"))
    with pytest.raises(InvalidInput):
        build(settings, SimScheduler())
    ok = build(settings.model_copy(update={"retention": RetentionSettings(events="30d")}), SimScheduler())
    assert ok.retention is not None and ok.retention.keep == KEEP
    assert build(settings.model_copy(update={"retention": RetentionSettings()}), SimScheduler()).retention is None


def test_each_run_is_counted_on_the_controller_metrics(tmp_path: Path) -> None:
    from gpufleet.controller.metrics import ControllerMetrics

    settings = ControllerSettings(database_url=f"sqlite:///{tmp_path / 'c.db'}", scheduler="sim",
                                  retention=RetentionSettings(events="30d", archive_dir=tmp_path / "a"))
    rt = build(settings, SimScheduler())
    assert rt.retention is not None
    metrics = ControllerMetrics(rt.controller)
    metrics.attach(retention=rt.retention)
    _store_events(rt.controller.store, 3, rt.controller.clock.now() - timedelta(days=31), "old")
    assert rt.retention.run_once() == 3
    assert metrics.registry.get_sample_value("gpufleet_events_deleted_total") == 3
    assert metrics.registry.get_sample_value("gpufleet_events_archived_total") == 3


def test_old_diagnostic_bundles_go_and_recent_ones_and_every_event_stay(engine: Engine) -> None:
    from gpufleet.controller.store.bundles import BundleStore
    from gpufleet.controller.store.models import BundleRow

    store = Store(engine)
    bundles = BundleStore(store)
    now = T0 + timedelta(days=100)
    for i, age in enumerate((120, 91, 89, 1)):
        bundles.put(f"b{i}:bundle", "n1", f"a{i}", {"format": "gpufleet.bundle/v1", "parts": {}},
                    now - timedelta(days=age), "test bundle")
    _store_events(store, 3, now - timedelta(days=200), "ancient")
    r = Retention(store, ManualClock(now), timedelta(0), bundles=timedelta(days=90))
    assert r.run_once() == 0  # events: kept (no [retention] events)
    with store.session() as s:
        left = sorted(s.scalars(select(BundleRow.id)))
    assert left == ["b2:bundle", "b3:bundle"] and r.bundles_deleted == 2
    assert len(_ids(store)) == 3


def test_a_bundle_horizon_under_a_week_is_refused(engine: Engine) -> None:
    with pytest.raises(InvalidInput) as err:
        Retention(Store(engine), ManualClock(T0), timedelta(0), bundles=timedelta(days=2))
    assert err.value.field == "retention.bundles"


def test_the_store_keeps_each_jobs_latest_checkpoint_only_and_retention_forgets_old_jobs(engine: Engine) -> None:
    store = Store(engine)
    day = timedelta(days=1)
    for i in range(5):  # job a checkpoints every day for five days (reports arrive as they are made)
        store.add_checkpoint("a", T0 + i * day, T0 + i * day)
    store.add_checkpoint("a", T0 + 2 * day, T0 + 5 * day)  # a late, older report: the newer one stands
    store.add_checkpoint("b", T0, T0)  # job b checkpointed once, 40 days before "now"
    store.add_checkpoint("c", T0 + 35 * day, T0 + 35 * day)
    with store.session() as s:
        rows = sorted((r.job_id, r.time) for r in s.scalars(select(CheckpointRow)))
    assert rows == [("a", T0 + 4 * day), ("b", T0), ("c", T0 + 35 * day)]
    assert store.last_checkpoints(["a", "b", "c", "never"]) == {"a": T0 + 4 * day, "b": T0, "c": T0 + 35 * day}

    r = Retention(store, ManualClock(T0 + 40 * day), KEEP)
    r.run_once()
    assert store.last_checkpoints(["a", "b", "c"]) == {"c": T0 + 35 * day}  # a and b: received over 30 days ago
    assert r.checkpoints_deleted == 2
    r.run_once()
    assert r.checkpoints_deleted == 2  # nothing more
    off = Retention(store, ManualClock(T0 + 400 * day), timedelta(0))  # retention off: nothing is forgotten
    off.run_once()
    assert store.last_checkpoints(["c"]) == {"c": T0 + 35 * day}


def test_a_run_stops_between_batches_when_the_replica_stops_leading(engine: Engine) -> None:
    store = Store(engine)
    _store_events(store, 12, T0, "old")
    r = Retention(store, ManualClock(T0 + timedelta(days=40)), KEEP, batch=4, min_pause_s=0.0)
    asked: list[int] = []

    def leads() -> bool:  # deposed after the first batch
        asked.append(r.deleted)
        return False

    assert r.run_once(leads) == 4
    assert asked == [4] and r.deleted == 4 and len(_ids(store)) == 8  # asked once, before the second batch
    assert r.run_once() == 8


def test_a_write_the_fence_refuses_mid_run_is_a_warning_and_the_loop_goes_on(engine: Engine,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    import threading

    from gpufleet.controller.ha.fence import Fenced

    store = Store(engine)
    _store_events(store, 3, T0, "old")
    r = Retention(store, ManualClock(T0 + timedelta(days=40)), KEEP)
    stop = threading.Event()
    runs: list[int] = []

    def fenced_then_stop(cutoff: datetime) -> tuple[int, int, bool]:
        runs.append(1)
        if len(runs) == 2:
            stop.set()
        raise Fenced(None, None)

    r._batch = fenced_then_stop  # type: ignore[method-assign]
    with caplog.at_level("WARNING", logger="gpufleet.controller.retention"):
        r.run_forever(stop, 0.0)
    assert len(runs) == 2  # the loop went on after the first refusal
    records = [x for x in caplog.records if x.name == "gpufleet.controller.retention"]
    assert records and all(x.levelname == "WARNING" and x.exc_info is None for x in records)
    assert "stopped leading" in records[0].getMessage()
