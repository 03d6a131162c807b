"""Event retention while ingest runs: does deleting a backlog of old events slow the reports coming in?

Issue #22 asks for events older than a horizon to be deleted "without blocking ingest". A real controller
(``bench_ingest``'s ``serve`` process, the simulated scheduler) starts on a database that already holds
``BACKLOG`` events received 30 days ago. At the fixed load of 1,250 reports/s (12,500 nodes every 10 s) the
latency of accepted reports is measured with retention off, then on a fresh copy of the same database with
``[retention] events = "8d"`` run every second, so the controller's own retention thread deletes the
backlog (2,000-row transactions, at most 50 per run) while the load runs; then the same with ``archive_dir``
set (each batch's rows read and appended to a gzip'd JSON-lines file before the delete); in turn,
``ROUNDS`` times.
SQLite, and PostgreSQL when ``GPUFLEET_TEST_POSTGRES_URL`` reaches one.

Reported per database and round: p50/p99 of accepted reports each way and their ratio, errors, and how
many old rows the retention thread deleted during the measured window (``gpufleet_events_deleted_total``
on the controller's /metrics), i.e. whether the deletion really overlapped the load. And, without load,
the retention thread's own CPU and wall time per batch, plain against archive (``batch_cost``): the
latencies under load swing with the shared box, the thread's CPU much less.
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


def one(url: str, nodes: int, rows: int, seconds: float, retention: str, archive: str = "") -> dict[str, Any]:
    """One phase on a fresh database: start the controller, register the nodes, add the old backlog (after
    start-up, so the retention thread's next run, within a second, meets the load), then the fixed load.
    ``archive``: the retention's archive_dir (the archived rows are counted from its files)."""
    names = node_names(nodes)
    with server(url, nodes, retention_events=retention, retention_archive=archive) as (base, pid):
        register(base, names)
        took = fill(url, rows, names)
        reports = Reports(names, seed=1)
        before = deleted_total(base)
        out = _fixed(base, reports, pid, RATE, seconds)
        out["old_rows_deleted_during_load"] = int(deleted_total(base) - before)
        out["fill_s"] = round(took, 1)
        keys = ["offered_per_s", "throughput_per_s", "p50_ms", "p99_ms", "errors", "unsent_backlog",
                "old_rows_deleted_during_load", "fill_s", "machine_busy"]
    if archive:  # after the controller stopped: its files are whole
        out["rows_archived"] = archived_rows(Path(archive))
        keys.append("rows_archived")
    return {k: out[k] for k in keys}


def archived_rows(root: Path) -> int:
    """Lines in the retention's archive files (one archived event each)."""
    import gzip

    n = 0
    for f in sorted(root.glob("events-*.jsonl.gz")):
        with gzip.open(f, "rt", encoding="utf-8") as lines:
            n += sum(1 for _ in lines)
    return n


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
        for mode, keep in (("retention_off", ""), ("retention_on", "8d"), ("retention_archive", "8d")):
            with make() as url, tempfile.TemporaryDirectory() as archive:
                assert url is not None
                per[mode] = one(url, nodes, rows, seconds, keep, archive if mode == "retention_archive" else "")
        off, on, arch = per["retention_off"], per["retention_on"], per["retention_archive"]
        per["p99_on_over_off"] = round(on["p99_ms"] / off["p99_ms"], 2) if off["p99_ms"] else None
        per["p99_archive_over_off"] = round(arch["p99_ms"] / off["p99_ms"], 2) if off["p99_ms"] else None
        rounds.append(per)
    return {"rounds": rounds}


def batch_cost(make: Callable[[], AbstractContextManager[str | None]], rows: int) -> dict[str, Any]:
    """The retention thread's own cost per 2,000-row batch, without load: thread CPU (what it holds the
    interpreter for, which request handlers then wait on) and wall time, plain delete against archive,
    each on a fresh database of the same backlog, in turn twice."""
    from gpufleet.controller.clock import SystemClock
    from gpufleet.controller.retention import Retention
    from gpufleet.controller.store.db import make_engine, migrate
    from gpufleet.controller.store.repo import Store

    out: dict[str, list[dict[str, float]]] = {"plain": [], "archive": []}
    for rnd in range(2):
        for mode in ("plain", "archive") if rnd == 0 else ("archive", "plain"):
            with make() as url, tempfile.TemporaryDirectory() as tmp:
                assert url is not None
                engine = make_engine(url)
                migrate(engine)
                fill(url, rows, node_names(1250))
                r = Retention(Store(engine), SystemClock(), timedelta(days=8),
                              archive_dir=Path(tmp) / "archive" if mode == "archive" else None)
                cutoff = datetime.now(UTC) - timedelta(days=8)
                cpu = wall = 0.0
                batches = deleted = 0
                more = True
                while more:
                    c0, w0 = time.thread_time(), time.perf_counter()
                    n, _, more = r._batch(cutoff)
                    cpu += time.thread_time() - c0
                    wall += time.perf_counter() - w0
                    batches += 1
                    deleted += n
                engine.dispose()
                out[mode].append({"rows": deleted, "cpu_ms_per_batch": round(1000 * cpu / batches, 1),
                                  "wall_ms_per_batch": round(1000 * wall / batches, 1)})
    cpu_of = {m: sum(x["cpu_ms_per_batch"] for x in v) / len(v) for m, v in out.items()}
    return {**out, "archive_cpu_over_plain": round(cpu_of["archive"] / cpu_of["plain"], 2) if cpu_of["plain"] else None}


def run(quick: bool) -> dict[str, Any]:
    nodes = 1250 if quick else 12_500
    rows = 20_000 if quick else BACKLOG
    seconds = 3.0 if quick else 15.0
    result: dict[str, Any] = {"nodes": nodes, "backlog_rows": rows, "offered_per_s": RATE,
                              "seconds_per_phase": seconds, "retention": "events = 8d, every 1 s, 2,000-row batches",
                              "archive": "retention_archive: the same with archive_dir (a temporary directory)"}
    cost_rows = 10_000 if quick else 40_000
    with fresh_databases() as sqlite:
        result["sqlite"] = compare(sqlite, nodes, rows, seconds)
        result["sqlite"]["batch_cost"] = batch_cost(sqlite, cost_rows)
    with postgres_database() as probe:  # reachable? (each phase then gets a database of its own)
        available = probe is not None
    if available:
        result["postgresql"] = compare(postgres_database, nodes, rows, seconds)
        result["postgresql"]["batch_cost"] = batch_cost(postgres_database, cost_rows)
    else:
        result["postgresql"] = {"available": False,
                                "reason": "no reachable PostgreSQL (GPUFLEET_TEST_POSTGRES_URL / DATABASE_URL)"}
    return result
