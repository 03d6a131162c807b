"""Ingest with one and two controller replicas on one PostgreSQL, side by side (issue #22 item 1).

The replicas are ``bench.bench_ingest serve`` processes (the production runtime: election, fence,
forwarding). The first to start leads; the second follows and forwards every report to the leader. The
load generator is bench_ingest's (agents' reports of 1-5 events, keep-alive connections):

* **one replica** — closed loop, every connection to the leader;
* **two replicas** — the same connections split half and half between leader and follower, as a
  Service spreading agents over the pods would;
* **through the follower only** — every connection to the follower (the forwarding hop's cost);
* **fixed load** — 1,250 reports/s (12,500 nodes every 10 s) split over both replicas, open loop.

All writes go through the leader (0100), so a second replica is expected to add availability, not
ingest capacity: the scaling ratio says what a forwarded report costs. CPU seconds of each process are
recorded: on a 2-core machine the two replicas, PostgreSQL and the load generator share the cores.
Run: ``python -m bench replicas [--quick]`` (PostgreSQL from ``GPUFLEET_TEST_POSTGRES_URL``).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import httpx

from bench.bench_ingest import (
    ADMIN,
    CONNECTIONS,
    RATE,
    Reports,
    _run,
    busy_share,
    closed_loop,
    cpu_seconds,
    fixed_load,
    machine_cpu,
    node_names,
    own_cpu,
    postgres_database,
    register,
    server,
    summary,
)


def follower_ready(base: str, leader: str, timeout: float = 30.0) -> None:
    """Poll the follower's /v1/health until it knows where the leader serves."""
    deadline = time.monotonic() + timeout
    while True:
        h = httpx.get(f"{base}/v1/health", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=5).json()
        if h["role"] == "follower" and h["leader_url"] == leader:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the second replica did not follow the first: {h}")
        time.sleep(0.1)


def split(bases: list[str], reports: Reports, seconds: float, pids: list[int], *,
          rate: float | None = None) -> dict[str, Any]:
    """Closed loop (or open loop at ``rate`` in all) over ``bases``, the connections split evenly."""
    async def both() -> list[Any]:
        if rate is None:
            return await asyncio.gather(*(closed_loop(b, reports, CONNECTIONS // len(bases), seconds)
                                          for b in bases))
        return await asyncio.gather(*(fixed_load(b, reports, rate / len(bases), seconds) for b in bases))

    s0, c0, m0 = [cpu_seconds(p) for p in pids], own_cpu(), machine_cpu()
    parts = _run(both())
    cpu = {f"replica_{i}": cpu_seconds(p) - s for i, (p, s) in enumerate(zip(pids, s0, strict=True))}
    cpu["load_generator"] = own_cpu() - c0
    lat = [x for part in parts for x in part[0]]
    errors = sum(part[1] for part in parts)
    elapsed = max(part[2] for part in parts)
    out = summary(lat, errors, elapsed, rate, cpu) | {"machine_busy": busy_share(m0, machine_cpu())}
    replicas_cpu = sum(v for k, v in cpu.items() if k.startswith("replica_"))
    out["replicas_cpu_ms_per_report"] = round(1000 * replicas_cpu / max(1, len(lat)), 2)
    return out


def run(quick: bool) -> dict[str, Any]:
    nodes = 1250 if quick else 12_500
    seconds = 3.0 if quick else 10.0
    result: dict[str, Any] = {"nodes": nodes, "seconds_per_phase": seconds, "connections": CONNECTIONS,
                              "load_average_1m_at_start": round(os.getloadavg()[0], 2)}
    with postgres_database() as url:
        if url is None:
            return result | {"available": False, "reason": "no reachable PostgreSQL (GPUFLEET_TEST_POSTGRES_URL)"}
        names = node_names(nodes)
        with server(url, nodes) as (a, pa):
            register(a, names)
            reports = Reports(names, seed=1)
            _run(closed_loop(a, reports, 4, min(2.0, seconds)))  # warm-up
            result["one_replica"] = split([a], reports, seconds, [pa])
            with server(url, nodes) as (b, pb):
                follower_ready(b, a)
                _run(closed_loop(b, reports, 4, min(2.0, seconds)))  # warm-up (the forwarding client)
                result["two_replicas"] = split([a, b], reports, seconds, [pa, pb])
                result["through_follower_only"] = split([b], reports, seconds, [pa, pb])
                result["fixed_load_two_replicas"] = split([a, b], reports, seconds, [pa, pb], rate=RATE)
    one, two = result["one_replica"], result["two_replicas"]
    result["scaling_ratio_two_over_one"] = round(two["throughput_per_s"] / one["throughput_per_s"], 2)
    result["cpu_per_report_two_over_one"] = round(two["replicas_cpu_ms_per_report"]
                                                  / one["replicas_cpu_ms_per_report"], 2)
    result["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    return result
