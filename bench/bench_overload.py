"""Overload: agents' reports offered past the controller's capacity, with admission control (``[limits]
ingest_queue_events`` and ``max_inflight_reports``) and without (the behaviour before issue #16), side by side.

The question is what happens past capacity. Unbounded, every report is queued: the backlog, the wait of
*every* report and the server's memory grow for as long as the overload lasts. Bounded, reports beyond
the bound are answered 429 at once (the agent keeps them in its spool and comes back after
``Retry-After``): the wait of the accepted ones stays bounded by the queue's size over the writer's speed,
and memory stays flat.

Method: one real controller process per mode (SQLite, 12,500 nodes, the reconciler on), the closed-loop
maximum measured first in each, then an open-loop ramp at 0.5, 1, 2 and 3 times the bounded mode's
maximum, ``SECONDS`` per step, over ``CONNECTIONS`` keep-alive connections (many agents at once: the
queue can only fill when many reports are in flight). Per step: reports answered 202 and their p50/p99
(from the time each was due, so waiting for a free connection counts), 429s, failures, reports still
unsent when the step's grace ran out, and the server's RSS after the step.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from typing import Any

from bench.bench_ingest import (
    GRACE_S,
    Connection,
    Reports,
    _run,
    closed_loop,
    node_names,
    percentile,
    register,
    server,
)

NODES = 12_500
CONNECTIONS = 2048  # agents with a report in flight at once (a 12,500-node fleet reporting every 10 s)
BOUND = 2_000  # events queued for the writer before a report is answered 429 (~0.3-0.5 s of work here)
INFLIGHT = 256  # [limits] max_inflight_reports in the bounded mode
UNBOUNDED = 10**9
SHARES = (0.5, 1.0, 2.0, 3.0)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def ramp_step(base: str, reports: Reports, rate: float, seconds: float) -> dict[str, Any]:
    """Open loop at ``rate`` reports/s for ``seconds``: latency from each report's due time."""
    accepted: list[float] = []
    refused: list[float] = []
    failed = unsent = 0
    queue: asyncio.Queue[float | None] = asyncio.Queue()
    hard_stop = 0.0

    async def worker(conn: Connection) -> None:
        nonlocal failed, unsent
        while (due := await queue.get()) is not None:
            if hard_stop and time.perf_counter() > hard_stop:
                unsent += 1
                continue
            status = await conn.post(json_body(reports))
            took = time.perf_counter() - due
            if status == 202:
                accepted.append(took)
                continue
            if status == 429:
                refused.append(took)
            else:
                failed += 1
            if status == 0 or conn.closing:  # failed, or the server closed it (Connection: close): open another
                await conn.close()
                conn = await Connection.open(base)
        await conn.close()

    conns = [await Connection.open(base) for _ in range(CONNECTIONS)]
    tasks = [asyncio.create_task(worker(c)) for c in conns]
    t0 = time.perf_counter()
    n = int(rate * seconds)
    for i in range(n):
        due = t0 + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)  # pacing the offered load (open loop), not waiting for a result
        queue.put_nowait(due)
    hard_stop = time.perf_counter() + GRACE_S
    for _ in tasks:
        queue.put_nowait(None)
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - t0
    return {
        "offered_per_s": round(rate), "accepted": len(accepted), "accepted_per_s": round(len(accepted) / elapsed, 1),
        "refused_429": len(refused), "failed": failed, "unsent_at_grace": unsent,
        "accepted_p50_ms": round(percentile(accepted, 50) * 1000, 1),
        "accepted_p99_ms": round(percentile(accepted, 99) * 1000, 1),
        "refused_p99_ms": round(percentile(refused, 99) * 1000, 1) if refused else None,
    }


def json_body(reports: Reports) -> bytes:
    import json

    return json.dumps(reports.next()).encode()


def mode(database_url: str, queue_events: int, max_inflight: int, rates: list[float] | None, seconds: float
         ) -> dict[str, Any]:
    names = node_names(NODES)
    with server(database_url, NODES, queue_events=queue_events, max_inflight=max_inflight) as (base, pid):
        register(base, names)
        reports = Reports(names, seed=7)
        lat, _errors, elapsed = _run(closed_loop(base, reports, 32, min(3.0, seconds)))
        out: dict[str, Any] = {"queue_events": queue_events if queue_events != UNBOUNDED else "unbounded",
                               "max_inflight_reports": max_inflight if max_inflight != UNBOUNDED else "unbounded",
                               "closed_loop_max_per_s": round(len(lat) / elapsed, 1),
                               "rss_mb_before": round(rss_mb(pid), 1)}
        steps = []
        for rate in rates or [s * out["closed_loop_max_per_s"] for s in SHARES]:
            step = _run(ramp_step(base, reports, rate, seconds))
            step["rss_mb_after"] = round(rss_mb(pid), 1)
            steps.append(step)
        out["steps"] = steps
        return out


def run(quick: bool) -> dict[str, Any]:
    seconds = 3.0 if quick else 8.0
    result: dict[str, Any] = {"nodes": NODES, "connections": CONNECTIONS, "seconds_per_step": seconds,
                              "shares_of_capacity": list(SHARES)}
    with tempfile.TemporaryDirectory() as tmp:
        bounded = mode(f"sqlite:///{tmp}/bounded.db", BOUND, INFLIGHT, None, seconds)
        rates = [s * bounded["closed_loop_max_per_s"] for s in SHARES]  # the same offered rates for both
        unbounded = mode(f"sqlite:///{tmp}/unbounded.db", UNBOUNDED, UNBOUNDED, rates, seconds)
    result["bounded"], result["unbounded"] = bounded, unbounded
    top_b, top_u = bounded["steps"][-1], unbounded["steps"][-1]
    result["at_3x_capacity"] = {
        "accepted_p99_ratio_unbounded_over_bounded": round(top_u["accepted_p99_ms"] / top_b["accepted_p99_ms"], 2),
        "rss_growth_mb": {"bounded": round(top_b["rss_mb_after"] - bounded["rss_mb_before"], 1),
                          "unbounded": round(top_u["rss_mb_after"] - unbounded["rss_mb_before"], 1)},
    }
    result["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    return result
