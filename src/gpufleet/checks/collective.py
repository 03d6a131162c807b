"""All-reduce bus bandwidth with torch.distributed: one process per GPU on a node (NCCL), or per CPU
"device" (gloo) on the CPU path; and the timed all-reduce the multi-node check reuses.

Bus bandwidth is computed as nccl-tests does: ``algbw = bytes / time``,
``busbw = algbw * 2 * (n - 1) / n`` for n ranks, with the slowest rank's time.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from gpufleet.checks._torch import require_torch
from gpufleet.checks.launch import injected_delay
from gpufleet.domain.errors import ExternalError, InvalidInput

log = logging.getLogger(__name__)

INIT_TIMEOUT = timedelta(seconds=300)


def bus_bandwidth(nbytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth in GB/s."""
    if ranks < 2:
        raise InvalidInput("ranks", ranks, "at least 2 for a bus bandwidth")
    if seconds <= 0:
        raise InvalidInput("seconds", seconds, "a positive time")
    return nbytes / seconds / 1e9 * 2.0 * (ranks - 1) / ranks


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def timed_allreduce(
    device: str, nbytes: int, iters: int, warmup: int, *, group: Any = None, delay_s: float = 0.0
) -> float:
    """Seconds per all-reduce of ``nbytes`` (float32) in ``group`` on this rank.

    ``delay_s`` is the test-only slow-peer knob: this rank sleeps that long after each timed
    all-reduce, which holds up its peers at the next one.
    """
    torch = require_torch()
    dist = torch.distributed
    buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(buf, group=group)
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    dist.barrier(group=group)
    trials = min(3, iters)
    per_trial = max(1, iters // trials)
    times = []
    for _ in range(trials):  # median of up to three trials: one preempted trial does not decide
        t0 = time.perf_counter()
        for _ in range(per_trial):
            dist.all_reduce(buf, group=group)
            if delay_s:
                time.sleep(delay_s)
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) / per_trial)
    return statistics.median(times)


def worker_main(argv: list[str] | None = None) -> int:
    """One rank of the single-node all-reduce: ``python -m gpufleet.checks.collective NBYTES ITERS
    WARMUP`` under RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (set by :func:`node_allreduce`).
    Prints ``{"rank": R, "seconds": S}`` as one JSON line."""
    from gpufleet.checks.launch import launch_env

    args = sys.argv[1:] if argv is None else argv
    nbytes, iters, warmup = (int(a) for a in args[:3])
    cuda = len(args) > 3 and args[3] == "cuda"
    torch = require_torch()
    dist = torch.distributed
    env = launch_env(os.environ, socket.gethostname())
    if cuda:
        torch.cuda.set_device(env.local_rank)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=f"tcp://{env.master_addr}:{env.master_port}",
        rank=env.rank,
        world_size=env.world_size,
        timeout=INIT_TIMEOUT,
    )
    try:
        device = f"cuda:{env.local_rank}" if cuda else "cpu"
        seconds = timed_allreduce(device, nbytes, iters, warmup, delay_s=injected_delay(os.environ, env.rank))
    finally:
        dist.destroy_process_group()
    print(json.dumps({"rank": env.rank, "seconds": seconds}), flush=True)
    return 0


def node_allreduce(
    world: int, cuda: bool, nbytes: int, iters: int, warmup: int, *, timeout_s: float = 600.0
) -> float:
    """Bus bandwidth (GB/s) of an all-reduce across ``world`` local processes, one per GPU (NCCL) or
    per CPU device (gloo), started the way torchrun would (RANK, WORLD_SIZE, MASTER_* in the
    environment). Raises ExternalError naming the rank that failed and its last error line."""
    if world < 2:
        raise InvalidInput("world", world, "at least 2 processes for an all-reduce")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="gpufleet-allreduce-") as tmp:
        procs, logs = [], []
        for rank in range(world):
            env = dict(os.environ)
            env.update(
                {
                    "RANK": str(rank),
                    "WORLD_SIZE": str(world),
                    "LOCAL_RANK": str(rank),
                    "LOCAL_WORLD_SIZE": str(world),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                }
            )
            cmd = [
                sys.executable,
                "-m",
                "gpufleet.checks.collective",
                str(nbytes),
                str(iters),
                str(warmup),
                "cuda" if cuda else "cpu",
            ]
            out_path, err_path = Path(tmp, f"{rank}.out"), Path(tmp, f"{rank}.err")
            with out_path.open("w") as out, err_path.open("w") as err:
                procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=err))
            logs.append((out_path, err_path))
        deadline = time.monotonic() + timeout_s
        # Poll all ranks: one that dies must not leave the others waiting for the rendezvous timeout.
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs) or time.monotonic() > deadline:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
                break
            time.sleep(0.05)  # waiting for child processes; not part of any measurement
        got: dict[int, float] = {}
        errors: list[str] = []
        for rank, (proc, (out_path, err_path)) in enumerate(zip(procs, logs, strict=True)):
            out_text, err_text = out_path.read_text(), err_path.read_text()
            if proc.returncode != 0:
                last = (err_text.strip().splitlines() or ["(killed: another rank failed or timed out)"])[-1]
                errors.append(f"rank {rank} exited {proc.returncode}: {last}")
                continue
            try:
                got[rank] = float(json.loads(out_text.strip().splitlines()[-1])["seconds"])
            except (ValueError, KeyError, IndexError) as exc:
                errors.append(f"rank {rank} printed no result ({exc}): {out_text[-200:]!r}")
    if errors:
        raise ExternalError("all-reduce", "; ".join(errors), retryable=False)
    return bus_bandwidth(nbytes, max(got.values()), world)


if __name__ == "__main__":
    raise SystemExit(worker_main())
