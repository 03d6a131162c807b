"""The controller's fleet judge over a day of a fleet's stored check results (SQLite).

Side by side in one run: one ``FleetJudge.run_once`` (its own read, ``Store.check_events_since``:
plain columns, the check filter in the database) against the same judgement fed by the generic
``Store.events_since`` (ORM rows turned into HealthEvents). Both must find the same outliers.
"""

from __future__ import annotations

import random
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpufleet.checks.events import result_to_event
from gpufleet.checks.fleet import outliers
from gpufleet.checks.model import CheckResult, Status
from gpufleet.controller.clock import ManualClock
from gpufleet.controller.fleetjudge import SOURCE, FleetJudge
from gpufleet.controller.service import Controller
from gpufleet.controller.store.db import make_engine, migrate
from gpufleet.controller.store.repo import CheckEvent, Store
from gpufleet.domain.fleet import simulated_fleet
from gpufleet.lifecycle.config import parse_policy

T0 = datetime(2026, 11, 21, tzinfo=UTC)
GPUS = 8
# What `gpufleet check --level quick` posts per GPU; the judge reads five of them (gemm_*, hbm_copy).
CHECKS = {"gemm_bf16": 730.0, "gemm_fp16": 730.0, "gemm_tf32": 378.0, "gemm_fp8": 1530.0,
          "hbm_copy": 2900.0, "pcie_h2d": 53.0, "pcie_d2h": 53.0, "sdc": 0.0}


def _fill(c: Controller, clock: ManualClock, names: list[str], runs: int, slow: str) -> int:
    rnd = random.Random(1)
    n = 0
    for run in range(runs):
        batch = []
        for node in names:
            for gpu in range(GPUS):
                for check, centre in CHECKS.items():
                    v = centre * (1 + rnd.gauss(0, 0.01)) * (0.85 if node == slow and check == "gemm_bf16" else 1)
                    r = CheckResult(check, gpu, v, "x", centre, Status.PASS)
                    batch.append(result_to_event(r, node=node, run_id=f"r{run}", time=clock.now(), sku="H100-SXM"))
            if len(batch) >= 4000:
                c.ingest(batch)
                n, batch = n + len(batch), []
        if batch:
            c.ingest(batch)
            n += len(batch)
        clock.advance(timedelta(hours=24) / runs)
    return n


def run(quick: bool) -> dict[str, object]:
    nodes, runs = (40, 3) if quick else (200, 8)
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{Path(tmp) / 'bench.db'}")
        migrate(engine)
        clock = ManualClock(T0)
        c = Controller(Store(engine), parse_policy({"policy": {"heartbeat_timeout": "0s"}}), clock)
        fleet = simulated_fleet(nodes, 4, gpus_per_node=GPUS)
        c.register_fleet(fleet)
        names = [n.id for n in fleet]
        stored = _fill(c, clock, names, runs, slow=names[nodes // 2])
        now = clock.now()
        judge = FleetJudge(c)
        c.set_dry_run(True, "bench")  # judge the same evidence in every round

        own, generic = [], []
        for _ in range(3):
            t = time.perf_counter()
            report = judge.run_once(now)
            own.append(time.perf_counter() - t)

            t = time.perf_counter()
            events = c.store.events_since(now - judge.window, kinds=("check_passed", "check_failed"))
            rows = [CheckEvent(e.id, e.node, e.time, dict(e.attrs)) for e in events if e.source != SOURCE]
            latest, _ = judge.latest(rows)
            found = outliers([m.sample for m in latest.values()], threshold=judge.threshold,
                             min_samples=judge.min_samples, min_rel=judge.min_rel)
            generic.append(time.perf_counter() - t)
        assert {o.sample.node for o in found} == {o.sample.node for o in report.outliers}
        engine.dispose()
    best_own, best_generic = min(own), min(generic)
    return {
        "nodes": nodes, "gpus": nodes * GPUS, "runs_per_day": runs, "stored_check_events": stored,
        "judged_samples": report.samples, "outlier_nodes": sorted({o.sample.node for o in report.outliers}),
        "run_once_s": round(best_own, 3),
        "via_events_since_s": round(best_generic, 3),
        "speedup": round(best_generic / best_own, 2),
        "stored_events_per_s": round(stored / best_own),
    }
