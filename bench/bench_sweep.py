"""Simulation sweeps (docs/benchmarks.md, ## sweep): a 1,000-replica Monte Carlo sweep timed in this
process, on local worker processes and on a local Ray instance, side by side in one run.

The campaign is small on purpose (1,024 GPUs for 7 days: a few ms to tens of ms per replica) so the
figures show the backends' overhead per task as much as their parallelism; the speed-up of a real
sweep (llama3-405b, ~0.3 s per replica) is bounded by the CPUs, which the ratio against serial shows.
Every backend's per-seed ETTRs are checked equal (a sweep that is fast but different is a bug).
"""

from __future__ import annotations

import os
import time
from typing import Any

from gpufleet.sim.compare import variants
from gpufleet.sim.config import SimConfig
from gpufleet.sim.sweep import Backend, ProcessBackend, RayBackend, SerialBackend, Variant, run_sweep


def _timed(sweep: list[Variant], replicas: int, backend: Backend) -> tuple[float, float, list[list[float]]]:
    w0, c0 = time.perf_counter(), time.process_time()
    summaries = run_sweep(sweep, replicas, 1, backend)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return wall, cpu, [[r.report.ettr for r in s.replicas] for s in summaries]


def run(quick: bool) -> dict[str, Any]:
    import logging

    logging.getLogger("gpufleet.lifecycle").setLevel(logging.ERROR)
    base = SimConfig().with_(gpus=1024, days=7.0)
    sweep = [Variant(label, cfg) for label, cfg in variants(base)][:5]  # 5 policy mixes
    replicas = 8 if quick else 200  # x 5 variants = 1,000 tasks in the full run
    out: dict[str, Any] = {"campaign": {"gpus": base.gpus, "days": base.days}, "variants": len(sweep),
                           "replicas": replicas, "tasks": len(sweep) * replicas, "cpus": os.cpu_count()}
    serial = _timed(sweep, replicas, SerialBackend())
    rows: dict[str, Any] = {"serial": {"wall_s": round(serial[0], 2), "driver_cpu_s": round(serial[1], 2)}}
    procs = ProcessBackend()
    wall, cpu, ettrs = _timed(sweep, replicas, procs)
    rows[procs.name] = {"wall_s": round(wall, 2), "driver_cpu_s": round(cpu, 2),
                        "speedup_vs_serial": round(serial[0] / wall, 2), "same_results": ettrs == serial[2]}
    try:
        import ray

        from gpufleet.sim.sweep import _runtime_env
    except ImportError as err:  # Ray not installed: say so in the results
        rows["ray local"] = {"skipped": str(err)}
    else:
        t0 = time.perf_counter()
        ray.init(include_dashboard=False, log_to_driver=False, runtime_env=_runtime_env())
        start = time.perf_counter() - t0
        try:
            for phase in ("cold workers", "warm workers"):  # the first map also starts and imports the workers
                wall, cpu, ettrs = _timed(sweep, replicas, RayBackend("local"))
                rows[f"ray local, {phase}"] = {
                    "wall_s": round(wall, 2), "driver_cpu_s": round(cpu, 2),
                    "speedup_vs_serial": round(serial[0] / wall, 2), "same_results": ettrs == serial[2]}
            rows["ray local, instance start"] = {"wall_s": round(start, 2)}
        finally:
            ray.shutdown()
    out["backends"] = rows
    out["ms_per_task_serial"] = round(1000 * serial[0] / out["tasks"], 2)
    return out
