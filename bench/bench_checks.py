"""Active checks: wall time of each level against its budget, and check values as % of ceilings.

Levels run for real (same code as ``gpufleet check``) on CUDA when torch sees a GPU, else on the CPU
path. Budgets: quick <= 60 s per node (a Slurm prolog), full <= 600 s. Ceilings are measured in the
same run with one large ``torch.matmul`` and one large device-to-device copy, so the quick level's
GEMM and HBM numbers read as "% of what this device does at large sizes".
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from gpufleet.checks import ops
from gpufleet.checks.baselines import load_baselines
from gpufleet.checks.collective import free_port
from gpufleet.checks.model import Level, Report
from gpufleet.checks.runner import CheckOptions, resolve_target, run_node_checks

BUDGET_S = {Level.QUICK: 60.0, Level.FULL: 600.0}


def _ceilings(cuda: bool, device: str) -> dict[str, float]:
    if cuda:
        return {
            "gemm_bf16_tflops": ops.gemm_tflops(device, "bf16", 16384, 20, 5),
            "copy_gbps": ops.device_copy_gbps(device, 8 << 30, 20, 3),
        }
    return {
        "gemm_fp32_tflops": ops.gemm_tflops(device, "fp32", 768, 6, 2),
        "copy_gbps": ops.device_copy_gbps(device, 256 << 20, 6, 2),
    }


def _level(level: Level, device: str, soak_s: float | None = None) -> tuple[Report, float]:
    t0 = time.perf_counter()
    report = run_node_checks(
        CheckOptions(level, device=device, soak_s=soak_s), load_baselines(), socket.gethostname()
    )
    return report, time.perf_counter() - t0


def _multinode_cpu(nodes: int) -> dict[str, object]:
    """``nodes`` local processes launched like torchrun, one per pretend node, over gloo."""
    exe = str(Path(sys.executable).parent / "gpufleet")
    port = free_port()
    t0 = time.perf_counter()
    procs = []
    for rank in range(nodes):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(nodes),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            GPUFLEET_NODE_NAME=f"bench-n{rank}",
        )
        cmd = [exe, "check", "--level", "multinode", "--device", "cpu", "--json"]
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        )
    outs = [p.communicate(timeout=600)[0] for p in procs]
    wall = time.perf_counter() - t0
    report = json.loads(outs[0])
    return {
        "nodes": nodes,
        "wall_s_with_process_start": round(wall, 2),
        "wall_s_checks": report["wall_s"],
        "status": report["status"],
    }


def _best(report: Report, check: str) -> float:
    values = [r.value for r in report.results if r.check == check]
    return max(values) if values else float("nan")


def run(quick: bool) -> dict[str, object]:
    target = resolve_target("auto", 2)
    device = target.devices[0]
    out: dict[str, object] = {
        "device": "cuda" if target.cuda else "cpu",
        "device_name": target.device_name,
        "gpus": len(target.devices),
    }
    levels: dict[str, object] = {}
    quick_report, quick_s = _level(Level.QUICK, "auto")
    levels["quick"] = {
        "wall_s": round(quick_s, 2),
        "budget_s": BUDGET_S[Level.QUICK],
        "budget_used": round(quick_s / BUDGET_S[Level.QUICK], 3),
        "results": len(quick_report.results),
        "status": str(quick_report.status),
    }
    if not quick:
        # Full sizes; the soak shortened to 30 s on a GPU (its length is the soak setting, not the checks).
        full_report, full_s = _level(Level.FULL, "auto", soak_s=30.0 if target.cuda else None)
        levels["full"] = {
            "wall_s": round(full_s, 2),
            "budget_s": BUDGET_S[Level.FULL],
            "budget_used": round(full_s / BUDGET_S[Level.FULL], 3),
            "soak_s": 30.0 if target.cuda else 3.0,
            "results": len(full_report.results),
            "status": str(full_report.status),
        }
        burnin_report, burnin_s = _level(Level.BURNIN, "auto", soak_s=60.0 if target.cuda else 5.0)
        levels["burnin"] = {
            "wall_s": round(burnin_s, 2),
            "soak_s": 60.0 if target.cuda else 5.0,
            "results": len(burnin_report.results),
            "status": str(burnin_report.status),
        }
        if not target.cuda:
            levels["multinode"] = _multinode_cpu(4)
    out["levels"] = levels
    ceil = _ceilings(target.cuda, device)
    gemm_check = "gemm_bf16" if target.cuda else "gemm_fp32"
    gemm_key = "gemm_bf16_tflops" if target.cuda else "gemm_fp32_tflops"
    out["ceilings"] = {k: round(v, 4) for k, v in ceil.items()}
    out["quick_vs_ceiling_pct"] = {
        gemm_check: round(100.0 * _best(quick_report, gemm_check) / ceil[gemm_key], 1),
        "hbm_copy": round(100.0 * _best(quick_report, "hbm_copy") / ceil["copy_gbps"], 1),
    }
    return out
