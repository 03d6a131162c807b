"""Overload: agents' reports offered past the controller's capacity, with admission control (``[limits]
ingest_queue_events`` and ``max_inflight_reports``) and without (the behaviour before issue #16), side by side.

The question is what happens past capacity. Unbounded, every report is queued: the backlog, the wait of
*every* report and the server's memory grow for as long as the overload lasts. Bounded, reports beyond
the bound are answered 429 at once (the agent keeps them in its spool and comes back after
``Retry-After``): the wait of the accepted ones stays bounded by the queue's size over the writer's speed,
and memory stays flat.

Method: one real controller process per mode (SQLite, 12,500 nodes, the reconciler on). The controller's
state fed by accepted events is bounded, and is filled before anything is measured, so that RSS during the
ramp shows what overload adds, not a cold start:

* each node's escalation sightings (``policy.Sightings``: per escalation its newest ``count``) — filled by
  ``fill_bodies``: one report per node with every shipped escalation's count of events, stamped just before
  the node's registration (minus the bench policy's ``clock_skew`` of 5 s), so they are remembered but
  never fresh (nothing escalates: the stale fatal-judged ones, XID 94 and link flaps, leave one
  ``stale_evidence`` audit line per node) and stay inside their windows for the whole run (checked: the run
  fails otherwise). The ramp's events are the kinds no escalation counts;
* the admission's merge index (one entry per fault of the last two merge windows, 60 s) — filled by a
  closed-loop warm-up at capacity for ``WARM_S`` (90 s).

Then the closed-loop maximum, then an open-loop ramp at 0.5, 1, 2 and 3 times the bounded mode's maximum,
3x held for eight more steps (does memory keep growing while the overload lasts?), ``SECONDS`` per step,
over ``CONNECTIONS`` keep-alive connections (many agents at once: the queue can only fill when many reports
are in flight). Per step: reports answered 202 and their p50/p99 (from the time each was due, so waiting
for a free connection counts), 429s, failures, reports still unsent when the step's grace ran out, and the
server's RSS after the step. A refused report's connection is reopened only when the server closed it.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.bench_ingest import (
    BENIGN,
    GRACE_S,
    Connection,
    Reports,
    _run,
    busy_share,
    closed_loop,
    cpu_seconds,
    machine_cpu,
    node_names,
    percentile,
    register,
    server,
)
from gpufleet.domain.catalog import DEFAULT_ESCALATIONS as ESCALATIONS

NODES = 12_500
CONNECTIONS = 2048  # agents with a report in flight at once (a 12,500-node fleet reporting every 10 s)
BOUND = 2_000  # events queued for the writer before a report is answered 429 (~0.3-0.5 s of work here)
INFLIGHT = 256  # [limits] max_inflight_reports in the bounded mode
UNBOUNDED = 10**9
SHARES = (0.5, 1.0, 2.0) + (3.0,) * 9  # 3x held for eight more steps: does memory keep growing?
WARM_S = 90.0  # closed loop at capacity before measuring: longer than the admission's merge index lives (2 x 30 s)
SKEW = timedelta(seconds=5)  # the bench policy's clock_skew: fill sightings are stamped before registration - this
FILL_SPAN = timedelta(seconds=30)  # fill sightings lie in the 30 s before that
# The ramp's events: the benign kinds no escalation counts. The fill holds every node's sightings at their
# bound already; counted events in the ramp would only replace them (same memory) and, on a node whose
# bound is full, fire the escalation (every node at once: a fleet-wide ECC storm, another benchmark).
UNCOUNTED = tuple(k for k in BENIGN if not any(e.kind == k[0] and e.code in (None, k[1]) for e in ESCALATIONS))


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


async def warm_up(base: str, reports: Reports, seconds: float, connections: int = 32) -> tuple[int, int]:
    """Closed loop for ``seconds``; returns the reports accepted and the posts refused or failed."""
    stop = time.perf_counter() + seconds
    accepted = failed = 0

    async def worker() -> None:
        nonlocal accepted, failed
        conn = await Connection.open(base)
        while time.perf_counter() < stop:
            if await conn.post(json_body(reports)) == 202:
                accepted += 1
                continue
            failed += 1
            await conn.close()
            conn = await Connection.open(base)
        await conn.close()

    await asyncio.gather(*(worker() for _ in range(connections)))
    return accepted, failed


def fill_bodies(names: list[str], registered: datetime) -> Iterator[bytes]:
    """One report per node with, for every shipped escalation, as many events as it can count (its bound
    in policy.Sightings), stamped in the ``FILL_SPAN`` before ``registered - 2 * SKEW``: each node's
    sightings are full from the start, none is fresh (so nothing escalates), and all stay inside their
    escalation's window until ``registered + shortest window - FILL_SPAN``."""
    latest = registered - 2 * SKEW
    for node in names:
        events = []
        for esc in ESCALATIONS:
            for i in range(esc.count):
                at = latest - FILL_SPAN * (i / esc.count)
                ev: dict[str, Any] = {"id": f"fill-{node}-{esc.kind}-{esc.code}-{i}", "node": node, "kind": esc.kind,
                                      "time": at.isoformat(), "component": f"{node}-gpu{i % 8}"}
                if esc.code is not None:
                    ev["code"] = esc.code
                events.append(ev)
        yield json.dumps({"events": events}).encode()


async def fill(base: str, bodies: Iterator[bytes], connections: int = 8) -> int:
    """Post every fill report (closed loop); returns how many were refused or failed (then sent again)."""
    failed = 0

    async def worker() -> None:
        nonlocal failed
        conn = await Connection.open(base)
        for body in bodies:
            while await conn.post(body) != 202:
                failed += 1
                await conn.close()
                conn = await Connection.open(base)
        await conn.close()

    await asyncio.gather(*(worker() for _ in range(connections)))
    return failed


def mode(database_url: str, queue_events: int, max_inflight: int, rates: list[float] | None, seconds: float,
         warm_s: float, nodes: int) -> dict[str, Any]:
    names = node_names(nodes)
    policy = Path(database_url.removeprefix("sqlite:///")).with_suffix(".policy.toml")
    policy.write_text(f'[policy]\nclock_skew = "{int(SKEW.total_seconds())}s"\n', encoding="utf-8")
    with server(database_url, nodes, queue_events=queue_events, max_inflight=max_inflight,
                policy_file=str(policy)) as (base, pid):
        before_register = datetime.now(UTC)
        register(base, names)
        reports = Reports(names, seed=7, kinds=UNCOUNTED)
        rss_cold = rss_mb(pid)
        t0 = time.perf_counter()
        fill_failed = _run(fill(base, fill_bodies(names, before_register)))
        fill_s, rss_filled = time.perf_counter() - t0, rss_mb(pid)
        t0 = time.perf_counter()
        warm_accepted, warm_failed = _run(warm_up(base, reports, warm_s))
        rss_warm = rss_mb(pid)
        lat, _errors, elapsed = _run(closed_loop(base, reports, 32, min(3.0, seconds)))
        out: dict[str, Any] = {"queue_events": queue_events if queue_events != UNBOUNDED else "unbounded",
                               "max_inflight_reports": max_inflight if max_inflight != UNBOUNDED else "unbounded",
                               "fill": {"events": nodes * sum(e.count for e in ESCALATIONS),
                                        "seconds": round(fill_s, 1), "refused_or_failed": fill_failed,
                                        "rss_mb_before": round(rss_cold, 1), "rss_mb_after": round(rss_filled, 1)},
                               "warm_up": {"reports": warm_accepted, "seconds": warm_s,
                                           "refused_or_failed": warm_failed, "rss_mb_after": round(rss_warm, 1)},
                               "closed_loop_max_per_s": round(len(lat) / elapsed, 1),
                               "rss_mb_before": round(rss_mb(pid), 1)}
        steps = []
        for rate in rates or [s * out["closed_loop_max_per_s"] for s in SHARES]:
            cpu0, box0 = cpu_seconds(pid), machine_cpu()
            step = _run(ramp_step(base, reports, rate, seconds))
            step["rss_mb_after"] = round(rss_mb(pid), 1)
            step["server_cpu_s"] = round(cpu_seconds(pid) - cpu0, 2)  # of the step's seconds (one core: 1 s/s)
            step["machine_busy"] = busy_share(box0, machine_cpu())  # both cores, every process on the box
            steps.append(step)
        out["steps"] = steps
        # The fill must still count when the run ends: none of it left its escalation's window.
        valid_until = before_register - 2 * SKEW - FILL_SPAN + min(e.window for e in ESCALATIONS)
        if datetime.now(UTC) >= valid_until:  # part of the fill left its window: the state was not full
            raise RuntimeError(f"the run outlasted the fill's shortest window (until {valid_until:%H:%M:%S}): "
                               "its RSS figures would include state being dropped; rerun on a quieter box")
        out["fill"]["still_in_window_at_end"] = True
        return out


def run(quick: bool) -> dict[str, Any]:
    seconds = 3.0 if quick else 8.0
    warm_s = 10.0 if quick else WARM_S
    nodes = 1_250 if quick else NODES
    result: dict[str, Any] = {"nodes": nodes, "connections": CONNECTIONS, "seconds_per_step": seconds,
                              "shares_of_capacity": list(SHARES)}
    with tempfile.TemporaryDirectory() as tmp:
        bounded = mode(f"sqlite:///{tmp}/bounded.db", BOUND, INFLIGHT, None, seconds, warm_s, nodes)
        rates = [s * bounded["closed_loop_max_per_s"] for s in SHARES]  # the same offered rates for both
        unbounded = mode(f"sqlite:///{tmp}/unbounded.db", UNBOUNDED, UNBOUNDED, rates, seconds, warm_s, nodes)
    result["bounded"], result["unbounded"] = bounded, unbounded
    top_b, top_u = bounded["steps"][-1], unbounded["steps"][-1]
    held = {m: [st["rss_mb_after"] for st, share in zip(r["steps"], SHARES, strict=True) if share == 3.0]
            for m, r in (("bounded", bounded), ("unbounded", unbounded))}
    result["at_3x_capacity"] = {
        "accepted_p99_ratio_unbounded_over_bounded": round(top_u["accepted_p99_ms"] / top_b["accepted_p99_ms"], 2),
        "rss_growth_mb": {"bounded": round(top_b["rss_mb_after"] - bounded["rss_mb_before"], 1),
                          "unbounded": round(top_u["rss_mb_after"] - unbounded["rss_mb_before"], 1)},
        "rss_mb_while_3x_lasted": held,  # after each 3x step: does memory keep growing while overload lasts?
        # The plateau test: growth over the last four held steps (the first ones absorb the step up from 2x:
        # more connections busy, larger groups per commit, the allocator's arenas at their new high).
        "rss_growth_mb_last_four_3x_steps": {m: round(v[-1] - v[-5], 1) for m, v in held.items()},
    }
    result["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    return result
