"""Idle GPUs: allocated to a Slurm job, doing nothing, for longer than a threshold (issue #19 item 4).

An allocated GPU that computes nothing is a GPU other work cannot use. The agent knows both halves:

* **Allocation** comes from the processes themselves: every process of a Slurm job step carries
  ``SLURM_JOB_ID`` in its environment, and the GPUs its job was given in ``SLURM_JOB_GPUS`` (Slurm's
  global indices, set for GRES jobs) or else ``CUDA_VISIBLE_DEVICES`` (numeric entries only; a UUID
  list or a cgroup-renumbered view is skipped rather than guessed). :func:`allocations` scans
  ``<proc_root>/*/environ`` (the agent runs as root; a process it may not read is skipped).
* **Idle** is the GPU's utilisation at or under ``max_util_pct`` at every slow tick for ``idle_after``.

When a GPU has been idle that long under one job, the agent reports ONE observation of kind
``gpu_idle`` (rule ``gpu_idle``, attrs ``job`` and ``idle_s``), judged ``info`` by the catalog: a
usage finding for the job's owner and the operators, never a fault and never a drain. It re-arms when
the GPU works again or the job ends. ``gpufleet_gpu_idle_seconds{gpu,job}`` shows how long each
allocated GPU has been idle. Nothing is killed: a notice to the owner, if wanted, is a site's alert
rule on that metric or a webhook on the event.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.fleet import gpu_slot

log = logging.getLogger(__name__)


def _environ(path: Path) -> dict[str, str]:
    try:
        raw = path.read_bytes()
    except OSError:  # gone, or not ours to read
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k in (b"SLURM_JOB_ID", b"SLURM_JOB_GPUS", b"CUDA_VISIBLE_DEVICES"):
            out[k.decode()] = v.decode(errors="replace")
    return out


def _indices(text: str) -> list[int]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    return [int(p) for p in parts] if parts and all(p.isdigit() for p in parts) else []


def allocations(proc_root: Path) -> dict[int, str]:
    """GPU index -> the Slurm job id its processes say it is allocated to (see the module docstring)."""
    out: dict[int, str] = {}
    try:
        pids = [e for e in os.listdir(proc_root) if e.isdigit()]
    except OSError:
        return out
    for pid in pids:
        env = _environ(proc_root / pid / "environ")
        job = env.get("SLURM_JOB_ID", "")
        if not job:
            continue
        for gpu in _indices(env.get("SLURM_JOB_GPUS", "")) or _indices(env.get("CUDA_VISIBLE_DEVICES", "")):
            out.setdefault(gpu, job)
    return out


@dataclass(slots=True)
class IdleGpus:
    node: str
    idle_after: timedelta = timedelta(minutes=30)
    max_util_pct: float = 5.0
    proc_root: Path = Path("/proc")
    idle_since: dict[tuple[int, str], datetime] = field(default_factory=dict)  # (gpu, job) -> idle since
    _reported: set[tuple[int, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.idle_after <= timedelta(0):
            raise InvalidInput("idle_gpu_after_s", self.idle_after.total_seconds(), "a duration > 0")
        if not 0 <= self.max_util_pct < 100:
            raise InvalidInput("idle_gpu_max_util_pct", self.max_util_pct, "a utilisation from 0 to under 100")

    def observe(self, now: datetime, util: Mapping[int, float | None],
                alloc: Mapping[int, str] | None = None) -> list[HealthEvent]:
        """One look (the slow tick): ``util`` per GPU index; ``alloc`` read from ``proc_root`` if not given."""
        jobs = allocations(self.proc_root) if alloc is None else alloc
        out: list[HealthEvent] = []
        seen = set()
        for gpu, job in sorted(jobs.items()):
            key = (gpu, job)
            u = util.get(gpu)
            if u is None or u > self.max_util_pct:
                self.idle_since.pop(key, None)
                self._reported.discard(key)
                continue
            seen.add(key)
            since = self.idle_since.setdefault(key, now)
            idle = now - since
            if idle >= self.idle_after and key not in self._reported:
                self._reported.add(key)
                out.append(self._event(gpu, job, since, now, idle))
        for key in set(self.idle_since) - seen:  # the job ended or the GPU is busy again: re-arm
            self.idle_since.pop(key, None)
            self._reported.discard(key)
        return out

    def idle_seconds(self, now: datetime) -> dict[tuple[int, str], float]:
        return {k: (now - t).total_seconds() for k, t in self.idle_since.items()}

    def _event(self, gpu: int, job: str, since: datetime, now: datetime, idle: timedelta) -> HealthEvent:
        slot = gpu_slot(self.node, gpu)
        minutes = idle.total_seconds() / 60
        return HealthEvent(
            f"{self.node}:gpu_idle:{slot}:{job}:{int(since.timestamp())}", self.node, EventKind.GPU_IDLE, now, slot,
            message=f"GPU {gpu} allocated to Slurm job {job} has been idle (utilisation <= "
                    f"{self.max_util_pct:g} %) for {minutes:.0f} min",
            source="nvml", attrs=(("rule", "gpu_idle"), ("job", job), ("gpu", str(gpu)),
                                  ("idle_s", f"{idle.total_seconds():.0f}")))
