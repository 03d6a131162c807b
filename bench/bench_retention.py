"""Event retention while ingest runs: does deleting a backlog of old events slow the reports coming in?

Issue #22 asks for events older than a horizon to be deleted "without blocking ingest". A real controller
(``bench_ingest``'s ``serve`` process, the simulated scheduler) starts on a database that already holds
``BACKLOG`` events received 30 days ago. At the fixed load of 1,250 reports/s (12,500 nodes every 10 s) the
latency of accepted reports is measured with retention off, then on a fresh copy of the same database with
``[retention] events = "8d"`` run every second, so the controller's own retention thread deletes the
backlog (2,000-row transactions, at most 50 per run) while the load runs; alternating, ``ROUNDS`` times.
SQLite, and PostgreSQL when ``GPUFLEET_TEST_POSTGRES_URL`` reaches one.

Reported per database and round: p50/p99 of accepted reports each way and their ratio, errors, and how
many old rows the retention thread deleted during the measured window (``gpufleet_events_deleted_total``
on the controller's /metrics), i.e. whether the deletion really overlapped the load.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import insert

from bench.bench_ingest import (
    ADMIN,
    RATE,
    Reports,
    _fixed,
    node_names,
    postgres_database,
    register,
    server,
)

BACKLOG = 400_000  # old events already in the table
ROUNDS = 2
CHUNK = 20_000


def fill(url: str, rows: int, names: list[str]) -> float:
    """Insert ``rows`` events received 30 days ago into the (migrated) database at ``url``; seconds taken."""
    from sqlalchemy import create_engine

    from gpufleet.controller.store.models import EventRow

    t0 = time.perf_counter()
    engine = create_engine(url)
    old = datetime.now(UTC) - timedelta(days=30)
    with engine.begin() as conn:
        for start in range(0, rows, CHUNK):
            conn.execute(insert(EventRow.__table__), [
                {"id": f"old-{i}", "node": names[i % len(names)], "kind": "xid", "time": old, "code": 13,
                 "severity": "info", "message": "", "source": "agent", "attrs": {}, "received": old}
                for i in range(start, min(rows, start + CHUNK))])
    engine.dispose()
    return time.perf_counter() - t0


def deleted_total(base: str) -> float:
    text = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10).text
    line = next((ln for ln in text.splitlines() if ln.startswith("gpufleet_events_deleted_total ")), "")
    return float(line.split()[1]) if line else 0.0


def one(url: str, nodes: int, rows: int, seconds: float, retention: str) -> dict[str, Any]:
    """One phase on a fresh database: start the controller, register the nodes, add the old backlog (after
    start-up, so the retention thread's next run, within a second, meets the load), then the fixed load."""
    names = node_names(nodes)
    with server(url, nodes, retention_events=retention) as (base, pid):
        register(base, names)
        took = fill(url, rows, names)
        reports = Reports(names, seed=1)
        before = deleted_total(base)
        out = _fixed(base, reports, pid, RATE, seconds)
        out["old_rows_deleted_during_load"] = int(deleted_total(base) - before)
        out["fill_s"] = round(took, 1)
        return {k: out[k] for k in ("offered_per_s", "throughput_per_s", "p50_ms", "p99_ms", "errors",
                                    "unsent_backlog", "old_rows_deleted_during_load", "fill_s", "machine_busy")}


@contextmanager
def fresh_databases() -> Iterator[Callable[[], AbstractContextManager[str | None]]]:
    """Yields a maker of fresh databases: SQLite files here, PostgreSQL ones via bench_ingest."""
    with tempfile.TemporaryDirectory() as tmp:
        n = [0]

        @contextmanager
        def sqlite() -> Iterator[str | None]:
            n[0] += 1
            yield f"sqlite:///{Path(tmp) / f'run{n[0]}.db'}"

        yield sqlite


def compare(make: Callable[[], AbstractContextManager[str | None]], nodes: int, rows: int,
            seconds: float) -> dict[str, Any]:
    rounds = []
    for _ in range(ROUNDS):
        per: dict[str, Any] = {}
        for mode, keep in (("retention_off", ""), ("retention_on", "8d")):
            with make() as url:
                assert url is not None
                per[mode] = one(url, nodes, rows, seconds, keep)
        off, on = per["retention_off"], per["retention_on"]
        per["p99_on_over_off"] = round(on["p99_ms"] / off["p99_ms"], 2) if off["p99_ms"] else None
        rounds.append(per)
    return {"rounds": rounds}


def run(quick: bool) -> dict[str, Any]:
    nodes = 1250 if quick else 12_500
    rows = 20_000 if quick else BACKLOG
    seconds = 3.0 if quick else 15.0
    result: dict[str, Any] = {"nodes": nodes, "backlog_rows": rows, "offered_per_s": RATE,
                              "seconds_per_phase": seconds, "retention": "events = 8d, every 1 s, 2,000-row batches"}
    with fresh_databases() as sqlite:
        result["sqlite"] = compare(sqlite, nodes, rows, seconds)
    with postgres_database() as probe:  # reachable? (each phase then gets a database of its own)
        available = probe is not None
    if available:
        result["postgresql"] = compare(postgres_database, nodes, rows, seconds)
    else:
        result["postgresql"] = {"available": False,
                                "reason": "no reachable PostgreSQL (GPUFLEET_TEST_POSTGRES_URL / DATABASE_URL)"}
    return result
