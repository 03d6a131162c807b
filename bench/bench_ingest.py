"""Controller event ingest over real HTTP on loopback: SQLite and PostgreSQL side by side.

The controller runs as it is deployed (``gpufleet controller serve``): the real FastAPI app under uvicorn,
its reconciler thread and a simulated scheduler, in a child process. A load generator (a minimal
asyncio HTTP/1.1 client, N keep-alive connections) plays 12,500 agents: each *report* is one
``POST /v1/events`` with 1-5 events (mostly informational: ecc_sbe, xid 13, aer_corrected; about one
report in 2,000 carries a fatal xid 79).

Two measurements per database:

* **fixed load** — reports are offered open-loop at ``RATE`` per second (12,500 nodes every 10 s =
  1,250/s). Latency is measured from each report's *scheduled* send time, so a stalled server shows up
  as latency instead of silently lowering the offered load (no coordinated omission).
* **max sustained** — closed loop: ``CONNECTIONS`` clients send back-to-back; throughput is what the
  server completes per second.

The child's and the load generator's CPU seconds are recorded too: on a 2-core machine they compete.
Run: ``python -m bench ingest [--quick]``. PostgreSQL comes from ``GPUFLEET_TEST_POSTGRES_URL`` (or
``DATABASE_URL``); when it is not reachable the result says so instead of failing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
RATE = 1250  # reports/s: 12,500 nodes reporting every 10 s
GOAL_P99_MS = 100.0
GRACE_S = 5.0  # how long the fixed-load phase waits for a backlog after its last report was due
NODES_PER_RACK = 32
CONNECTIONS = 32
HEARTBEAT_S = 30.0  # the agent's default heartbeat interval
ADMIN = "bench-admin-token-0001"
AGENT = "bench-agent-token-0001"
BENIGN = (("ecc_sbe", None), ("xid", 13), ("aer_corrected", None), ("link_error", None))


def node_names(n: int) -> list[str]:
    return [f"r{i // NODES_PER_RACK + 1:03d}-n{i % NODES_PER_RACK + 1:02d}" for i in range(n)]


# ---- the server (child process) -----------------------------------------------------------------
def serve(database_url: str, nodes: int, reconciler: bool, queue_events: int | None = None,
          max_inflight: int | None = None, retention_events: str = "", policy_file: str = "",
          retention_archive: str = "") -> None:
    """Run the controller like ``gpufleet controller serve``; print the port; stop when stdin closes."""
    import logging

    from gpufleet.controller.runtime import build
    from gpufleet.controller.settings import (
        ControllerSettings,
        LimitSettings,
        RetentionSettings,
        Role,
        SchedulerKind,
        TokenConfig,
    )
    from gpufleet.schedulers.sim import SimScheduler

    logging.basicConfig(level=logging.ERROR)  # an overload bench refuses thousands of requests: not a log line each
    limits = LimitSettings(**{k: v for k, v in (("ingest_queue_events", queue_events),
                                                ("max_inflight_reports", max_inflight)) if v is not None})
    settings = ControllerSettings(
        database_url=database_url, host="127.0.0.1", port=0, scheduler=SchedulerKind.SIM, limits=limits,
        policy_file=Path(policy_file) if policy_file else None,
        retention=RetentionSettings(events=retention_events or "0", interval=1.0,  # [retention], every second
                                    archive_dir=Path(retention_archive) if retention_archive else None),
        tokens=(TokenConfig(name="bench-admin", role=Role.ADMIN, token=ADMIN),
                TokenConfig(name="bench-agent", role=Role.AGENT, token=AGENT, nodes=("*",))))
    rt = build(settings, SimScheduler(node_names(nodes)))
    if reconciler:
        rt.start_reconciler()
    rt.start_api(in_thread=True, on_started=lambda port: print(f"PORT {port}", flush=True))
    sys.stdin.read()  # the parent closes our stdin to stop us
    rt.shutdown()


@contextmanager
def server(database_url: str, nodes: int, *, reconciler: bool = True, queue_events: int | None = None,
           max_inflight: int | None = None, retention_events: str = "", policy_file: str = "",
           retention_archive: str = "") -> Iterator[tuple[str, int]]:
    cmd = [sys.executable, "-m", "bench.bench_ingest", "serve", "--database-url", database_url,
           "--nodes", str(nodes)] + ([] if reconciler else ["--no-reconciler"]) + (
           [] if queue_events is None else ["--queue-events", str(queue_events)]) + (
           [] if max_inflight is None else ["--max-inflight", str(max_inflight)]) + (
           ["--retention-events", retention_events] if retention_events else []) + (
           ["--retention-archive", retention_archive] if retention_archive else []) + (
           ["--policy-file", policy_file] if policy_file else [])
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"controller did not start (exit {proc.poll()}): {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}", proc.pid
    finally:
        if proc.stdin is not None:
            with suppress(BrokenPipeError):
                proc.stdin.close()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine (Linux /proc/stat): the database server's share too."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """Share of all the machine's cores that were busy between two ``machine_cpu`` readings."""
    total = after[1] - before[1]
    return round((after[0] - before[0]) / total, 2) if total else 0.0


def own_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# ---- the load -----------------------------------------------------------------------------------
class Reports:
    """Report bodies: a random node, 1-5 events, rarely a fatal one; every event id unique."""

    def __init__(self, nodes: list[str], seed: int,
                 kinds: tuple[tuple[str, int | None], ...] = BENIGN) -> None:
        self.nodes = nodes
        self.kinds = kinds
        self.rng = random.Random(seed)
        self.seq = 0
        self.run = uuid.uuid4().hex[:8]

    def next(self) -> dict[str, Any]:
        node = self.rng.choice(self.nodes)
        now = datetime.now(UTC).isoformat()
        events = []
        for _ in range(self.rng.randint(1, 5)):
            self.seq += 1
            kind, code = ("xid", 79) if self.rng.random() < 1 / 6000 else self.rng.choice(self.kinds)
            ev: dict[str, Any] = {"id": f"{self.run}-{self.seq}", "node": node, "kind": kind, "time": now,
                                  "component": f"{node}-gpu{self.rng.randint(0, 7)}"}
            if code is not None:
                ev["code"] = code
            events.append(ev)
        return {"events": events}


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run the load on uvloop when it is installed (it is a controller dependency): a cheaper client."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


def summary(lat: list[float], errors: int, elapsed: float, offered: float | None, cpu: dict[str, float]
            ) -> dict[str, Any]:
    return {
        "offered_per_s": offered, "completed": len(lat), "errors": errors, "seconds": round(elapsed, 2),
        "throughput_per_s": round(len(lat) / elapsed, 1),
        "p50_ms": round(percentile(lat, 50) * 1000, 1), "p90_ms": round(percentile(lat, 90) * 1000, 1),
        "p99_ms": round(percentile(lat, 99) * 1000, 1), "max_ms": round(max(lat, default=0) * 1000, 1),
        "cpu_s": {k: round(v, 1) for k, v in cpu.items()},
    }


class Connection:
    """One keep-alive HTTP/1.1 connection speaking just enough HTTP for this benchmark.

    The load generator shares the two cores with the server, so it must be cheap: httpx cost about
    1.6 ms of CPU per report (half of what the server spent), which is load the real agents put on
    their own machines, not on the controller's. This client writes a pre-built request and reads the
    status line, the headers and a Content-Length body: ~30 us per report.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self.reader, self.writer = reader, writer
        self.host = host
        self.heads: dict[str, bytes] = {}
        self.closing = False  # the last answer said ``Connection: close``: open another to go on

    @classmethod
    async def open(cls, base: str) -> Connection:
        host_port = base.removeprefix("http://")
        host, port = host_port.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer, host_port)

    async def post(self, body: bytes, path: str = "/v1/events") -> int:
        """Send one request; return the HTTP status (0 when the connection failed)."""
        head = self.heads.get(path)
        if head is None:
            head = self.heads[path] = (f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\n"
                                       f"Authorization: Bearer {AGENT}\r\nContent-Type: application/json\r\n").encode()
        try:
            self.writer.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            head = await self.reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
                elif line.lower() == b"connection: close":
                    self.closing = True
            if length:
                await self.reader.readexactly(length)
            return status
        except (OSError, RuntimeError, asyncio.IncompleteReadError, ValueError):  # RuntimeError: closed transport
            return 0

    async def close(self) -> None:
        self.writer.close()
        with suppress(OSError):
            await self.writer.wait_closed()


async def _post(conn: Connection, reports: Reports) -> bool:
    return await conn.post(json.dumps(reports.next()).encode()) == 202


async def _beat(conn: Connection, reports: Reports) -> bool:
    node = reports.rng.choice(reports.nodes)
    body = json.dumps({"time": datetime.now(UTC).isoformat(), "agent_version": "bench"}).encode()
    return await conn.post(body, f"/v1/nodes/{node}/heartbeat") == 200


async def fixed_load(base: str, reports: Reports, rate: float, seconds: float, hb_rate: float = 0.0
                     ) -> tuple[list[float], int, float, int, list[float]]:
    """Open loop: report i is due at start + i / rate and goes out on the next free connection; its latency
    counts from the due time, so time spent waiting for a connection is part of it. Reports still queued
    ``GRACE_S`` after the last one was due are not sent: they are returned as ``unsent``. With
    ``hb_rate``, agents' heartbeats are offered the same way on the same connections (their latencies
    are returned apart; a failed heartbeat counts as an error too)."""
    lat: list[float] = []
    hb_lat: list[float] = []
    errors = unsent = 0
    due_times: asyncio.Queue[tuple[float, bool] | None] = asyncio.Queue()
    hard_stop = 0.0

    async def worker() -> None:
        nonlocal errors, unsent
        conn = await Connection.open(base)
        while (item := await due_times.get()) is not None:
            due, beat = item
            if hard_stop and time.perf_counter() > hard_stop:
                unsent += 1
            elif await (_beat(conn, reports) if beat else _post(conn, reports)):
                (hb_lat if beat else lat).append(time.perf_counter() - due)
            else:
                errors += 1
        await conn.close()

    workers = [asyncio.create_task(worker()) for _ in range(CONNECTIONS)]
    await asyncio.sleep(0.2)  # let the connections open
    start = time.perf_counter()
    schedule = [(start + i / rate, False) for i in range(int(rate * seconds))]
    if hb_rate:
        schedule += [(start + i / hb_rate, True) for i in range(int(hb_rate * seconds))]
    for due, beat in sorted(schedule):
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        due_times.put_nowait((due, beat))
    hard_stop = start + seconds + GRACE_S
    for _ in workers:
        due_times.put_nowait(None)
    await asyncio.gather(*workers)
    return lat, errors, time.perf_counter() - start, unsent, hb_lat


async def closed_loop(base: str, reports: Reports, connections: int, seconds: float
                      ) -> tuple[list[float], int, float]:
    """Closed loop: ``connections`` clients send back-to-back for ``seconds``."""
    lat: list[float] = []
    errors = 0
    start = time.perf_counter()
    stop = start + seconds

    async def worker() -> None:
        nonlocal errors
        conn = await Connection.open(base)
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            if await _post(conn, reports):
                lat.append(time.perf_counter() - t0)
            else:
                errors += 1
        await conn.close()

    await asyncio.gather(*(worker() for _ in range(connections)))
    return lat, errors, time.perf_counter() - start


def register(base: str, names: list[str]) -> float:
    t0 = time.perf_counter()
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=600) as client:
        for i in range(0, len(names), 2500):
            chunk = names[i:i + 2500]
            body = {"state": "ready", "nodes": [{"id": n, "rack": n.split("-")[0]} for n in chunk]}
            r = client.post("/v1/nodes", json=body)
            r.raise_for_status()
    return time.perf_counter() - t0


def _fixed(base: str, reports: Reports, pid: int, rate: float, seconds: float, hb_rate: float = 0.0
           ) -> dict[str, Any]:
    s0, c0, m0 = cpu_seconds(pid), own_cpu(), machine_cpu()
    lat, errors, elapsed, unsent, hb_lat = _run(fixed_load(base, reports, rate, seconds, hb_rate))
    cpu = {"server": cpu_seconds(pid) - s0, "load_generator": own_cpu() - c0}
    out = summary(lat, errors, elapsed, rate, cpu) | {"unsent_backlog": unsent,
                                                      "machine_busy": busy_share(m0, machine_cpu())}
    if hb_rate:
        out["heartbeats"] = {"offered_per_s": round(hb_rate, 1), "completed": len(hb_lat),
                             "p50_ms": round(percentile(hb_lat, 50) * 1000, 1),
                             "p99_ms": round(percentile(hb_lat, 99) * 1000, 1)}
    return out


def measure(database_url: str, nodes: int, seconds: float, *, reconciler: bool = True) -> dict[str, Any]:
    names = node_names(nodes)
    with server(database_url, nodes, reconciler=reconciler) as (base, pid):
        out: dict[str, Any] = {"register_s": round(register(base, names), 1)}
        reports = Reports(names, seed=1)
        _run(closed_loop(base, reports, 4, min(2.0, seconds)))  # warm-up
        s0, c0, m0 = cpu_seconds(pid), own_cpu(), machine_cpu()
        lat, errors, elapsed = _run(closed_loop(base, reports, CONNECTIONS, seconds))
        cpu = {"server": cpu_seconds(pid) - s0, "load_generator": own_cpu() - c0}
        busy = busy_share(m0, machine_cpu())
        out["max_sustained"] = summary(lat, errors, elapsed, None, cpu) | {"machine_busy": busy}
        out["server_cpu_ms_per_report"] = round(1000 * cpu["server"] / max(1, len(lat)), 2)
        out["fixed_load"] = _fixed(base, reports, pid, RATE, seconds)
        # The same reports with every agent's heartbeat on top (one per node every 30 s, the default).
        out["fixed_load_with_heartbeats"] = _fixed(base, reports, pid, RATE, seconds, hb_rate=nodes / HEARTBEAT_S)
        # The highest offered load (as a share of the closed-loop maximum) that still meets the p99 goal.
        top = out["max_sustained"]["throughput_per_s"]
        steps = []
        for share in (0.25, 0.5, 0.75, 0.9):
            step = _fixed(base, reports, pid, max(1.0, round(share * top)), seconds / 2)
            steps.append({k: step[k] for k in ("offered_per_s", "throughput_per_s", "p50_ms", "p99_ms",
                                               "unsent_backlog")})
        out["offered_load_steps"] = steps
        ok = [st["offered_per_s"] for st in steps if st["p99_ms"] < GOAL_P99_MS and st["unsent_backlog"] == 0]
        out["max_rate_with_p99_under_goal"] = max(ok, default=None)
        fixed = out["fixed_load"]
        out["meets_goal"] = bool(fixed["completed"] >= 0.99 * RATE * seconds and fixed["p99_ms"] < GOAL_P99_MS
                                 and fixed["errors"] == 0)
        return out


@contextmanager
def postgres_database() -> Iterator[str | None]:
    """A fresh database on the test PostgreSQL, or None when none is reachable."""
    from sqlalchemy import create_engine, make_url, text
    from sqlalchemy.exc import OperationalError

    url = os.environ.get("GPUFLEET_TEST_POSTGRES_URL") or os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgresql"):
        yield None
        return
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    name = f"gpufleet_bench_{uuid.uuid4().hex[:8]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError:
        admin.dispose()
        yield None
        return
    try:
        yield make_url(url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def run(quick: bool) -> dict[str, Any]:
    nodes = 1250 if quick else 12_500
    seconds = 3.0 if quick else 15.0
    result: dict[str, Any] = {"nodes": nodes, "offered_per_s": RATE, "seconds_per_phase": seconds,
                              "connections": CONNECTIONS, "goal": f"{RATE}/s with p99 < {GOAL_P99_MS:.0f} ms"}
    with tempfile.TemporaryDirectory() as tmp:
        result["sqlite"] = measure(f"sqlite:///{tmp}/bench.db", nodes, seconds)
    with postgres_database() as pg_url:
        if pg_url is None:
            result["postgresql"] = {"available": False,
                                    "reason": "no reachable PostgreSQL (GPUFLEET_TEST_POSTGRES_URL / DATABASE_URL)"}
        else:
            result["postgresql"] = measure(pg_url, nodes, seconds)
    pg, lite = result["postgresql"], result["sqlite"]
    if "max_sustained" in pg:
        result["ratio_pg_over_sqlite"] = {
            "max_sustained_throughput": round(pg["max_sustained"]["throughput_per_s"]
                                              / lite["max_sustained"]["throughput_per_s"], 2),
            "max_sustained_p99": round(pg["max_sustained"]["p99_ms"] / lite["max_sustained"]["p99_ms"], 2),
            "server_cpu_per_report": round(pg["server_cpu_ms_per_report"] / lite["server_cpu_ms_per_report"], 2),
        }
    result["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_ingest")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the controller (used by the benchmark itself)")
    s.add_argument("--database-url", required=True)
    s.add_argument("--nodes", type=int, required=True)
    s.add_argument("--no-reconciler", action="store_true")
    s.add_argument("--queue-events", type=int, default=None, help="[limits] ingest_queue_events")
    s.add_argument("--max-inflight", type=int, default=None, help="[limits] max_inflight_reports")
    s.add_argument("--retention-events", default="", help="[retention] events (run every second)")
    s.add_argument("--policy-file", default="", help="the controller's policy_file")
    s.add_argument("--retention-archive", default="", help="[retention] archive_dir")
    args = ap.parse_args(argv)
    serve(args.database_url, args.nodes, not args.no_reconciler, args.queue_events, args.max_inflight,
          args.retention_events, args.policy_file, args.retention_archive)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
