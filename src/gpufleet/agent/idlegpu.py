"""Idle GPUs: allocated to a Slurm job, doing nothing, for longer than a threshold (issue #19 item 4).

An allocated GPU that computes nothing is a GPU other work cannot use. The agent knows both halves:

* **Allocation** comes from the processes themselves: every process of a Slurm job step carries
  ``SLURM_JOB_ID`` in its environment, and the GPUs its job was given in ``SLURM_JOB_GPUS`` (Slurm's
  global indices, set for GRES jobs) or else ``CUDA_VISIBLE_DEVICES`` (numeric entries only; a UUID
  list or a cgroup-renumbered view is skipped rather than guessed). :func:`allocations` scans
  ``<proc_root>/*/environ`` (the agent runs as root; a process it may not read is skipped). The job's
  **owner** is the user its processes run as (the owner of ``<proc_root>/<pid>``, named from the passwd
  database, else the numeric uid); a root-owned process that carries the job's environment names the
  owner only when no process of the job runs as anyone else.
* **Idle** is the GPU's utilisation at or under ``max_util_pct`` at every slow tick for ``idle_after``.
  The GPU's memory in use is watched over the same window: the most it held is reported
  (``mem_used_mib``), and ``memory`` says ``empty`` (at most :data:`EMPTY_MIB`: nothing of the job's
  loaded, at most a CUDA context), ``held`` (the job keeps data on a GPU it does not compute on) or
  ``unknown`` (the device does not report memory). With ``max_memory_mib`` set, a GPU counts as idle
  only while it also holds at most that much (unknown memory then counts as not idle: the agent cannot
  show it is empty); unset (the default), memory does not decide.

When a GPU has been idle that long under one job, the agent reports ONE observation of kind
``gpu_idle`` (rule ``gpu_idle``, attrs ``job``, ``user``, ``idle_s``, ``memory``, ``mem_used_mib``),
judged ``info`` by the catalog: a usage finding for the job's owner and the operators, never a fault
and never a drain. It re-arms when the GPU works again (or holds more than ``max_memory_mib``) or the
job ends. ``gpufleet_gpu_idle_seconds{gpu,job,user}`` shows how long each allocated GPU has been idle.
Nothing is killed: a notice to the owner, if wanted, is a site's alert rule on that metric (routed on
its ``user`` label) or a poll of ``GET /v1/events?kind=gpu_idle`` (docs/operations.md).
"""

from __future__ import annotations

import logging
import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from pathlib import Path

from gpufleet.agent.eventids import event_id
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.fleet import gpu_slot

log = logging.getLogger(__name__)

MIB = 1024 * 1024
EMPTY_MIB = 1024.0  # at most this much in use over the idle window: nothing loaded (a CUDA context is ~0.5 GiB)


@dataclass(frozen=True, slots=True)
class Allocation:
    """A GPU's holder: the Slurm job and its owner (the user its processes run as; "" unknown)."""

    job: str
    user: str = ""


@lru_cache(maxsize=1024)
def user_name(uid: int) -> str:
    """The login name of ``uid`` from the passwd database (NSS), else the number itself."""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


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


def allocations(proc_root: Path) -> dict[int, Allocation]:
    """GPU index -> the Slurm job its processes say it is allocated to, and the job's owner (see the
    module docstring)."""
    try:
        pids = sorted((e for e in os.listdir(proc_root) if e.isdigit()), key=int)
    except OSError:
        return {}
    gpus: dict[int, str] = {}
    uids: dict[str, int] = {}  # job -> the uid its processes run as (a non-root one when there is one)
    for pid in pids:
        env = _environ(proc_root / pid / "environ")
        job = env.get("SLURM_JOB_ID", "")
        if not job:
            continue
        try:
            uid = os.stat(proc_root / pid).st_uid
        except OSError:  # the process ended between the two reads
            continue
        if uids.get(job, 0) == 0:
            uids[job] = uid
        for gpu in _indices(env.get("SLURM_JOB_GPUS", "")) or _indices(env.get("CUDA_VISIBLE_DEVICES", "")):
            gpus.setdefault(gpu, job)
    return {gpu: Allocation(job, user_name(uids[job])) for gpu, job in gpus.items()}


@dataclass(slots=True)
class IdleGpus:
    node: str
    idle_after: timedelta = timedelta(minutes=30)
    max_util_pct: float = 5.0
    proc_root: Path = Path("/proc")
    max_memory_mib: float | None = None  # set: idle only while holding at most this much memory
    idle_since: dict[tuple[int, str], datetime] = field(default_factory=dict)  # (gpu, job) -> idle since
    owners: dict[tuple[int, str], str] = field(default_factory=dict)  # (gpu, job) -> the job's owner
    _mem_max: dict[tuple[int, str], float] = field(default_factory=dict)  # most memory held while idle, MiB
    _reported: set[tuple[int, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.idle_after <= timedelta(0):
            raise InvalidInput("idle_gpu_after_s", self.idle_after.total_seconds(), "a duration > 0")
        if not 0 <= self.max_util_pct < 100:
            raise InvalidInput("idle_gpu_max_util_pct", self.max_util_pct, "a utilisation from 0 to under 100")
        if self.max_memory_mib is not None and not self.max_memory_mib >= 0:  # NaN too
            raise InvalidInput("idle_gpu_max_memory_mib", self.max_memory_mib,
                               "MiB >= 0 (or unset: memory does not decide idleness)")

    def observe(self, now: datetime, util: Mapping[int, float | None],
                alloc: Mapping[int, Allocation] | None = None,
                mem_mib: Mapping[int, float | None] | None = None) -> list[HealthEvent]:
        """One look (the slow tick): ``util`` (%) and ``mem_mib`` (memory in use, MiB) per GPU index;
        ``alloc`` read from ``proc_root`` if not given."""
        jobs = allocations(self.proc_root) if alloc is None else alloc
        mem = mem_mib or {}
        out: list[HealthEvent] = []
        seen = set()
        for gpu, holder in sorted(jobs.items()):
            key = (gpu, holder.job)
            u, m = util.get(gpu), mem.get(gpu)
            if u is None or u > self.max_util_pct or not self._small_enough(m):
                self._forget(key)
                continue
            seen.add(key)
            self.owners[key] = holder.user
            since = self.idle_since.setdefault(key, now)
            if m is not None:
                self._mem_max[key] = max(m, self._mem_max.get(key, 0.0))
            idle = now - since
            if idle >= self.idle_after and key not in self._reported:
                self._reported.add(key)
                out.append(self._event(gpu, holder, since, now, idle))
        for key in set(self.idle_since) - seen:  # the job ended or the GPU is busy again: re-arm
            self._forget(key)
        return out

    def idle_seconds(self, now: datetime) -> dict[tuple[int, str], float]:
        return {k: (now - t).total_seconds() for k, t in self.idle_since.items()}

    def _small_enough(self, used_mib: float | None) -> bool:
        if self.max_memory_mib is None:
            return True
        return used_mib is not None and used_mib <= self.max_memory_mib

    def _forget(self, key: tuple[int, str]) -> None:
        self.idle_since.pop(key, None)
        self.owners.pop(key, None)
        self._mem_max.pop(key, None)
        self._reported.discard(key)

    def _event(self, gpu: int, holder: Allocation, since: datetime, now: datetime,
               idle: timedelta) -> HealthEvent:
        key = (gpu, holder.job)
        slot = gpu_slot(self.node, gpu)
        minutes = idle.total_seconds() / 60
        used = self._mem_max.get(key)
        if used is None:
            memory, held = "unknown", "memory in use not reported"
        elif used <= EMPTY_MIB:
            memory, held = "empty", f"nothing loaded (at most {used:.0f} MiB in use)"
        else:
            memory, held = "held", f"holding up to {used:.0f} MiB of GPU memory"
        owner = f" (user {holder.user})" if holder.user else ""
        attrs = [("rule", "gpu_idle"), ("job", holder.job), ("gpu", str(gpu)),
                 ("idle_s", f"{idle.total_seconds():.0f}"), ("memory", memory)]
        if used is not None:
            attrs.append(("mem_used_mib", f"{used:.0f}"))
        if holder.user:
            attrs.append(("user", holder.user))
        return HealthEvent(  # the id's time is the spell's start: one report per (GPU, job) and idle spell
            event_id(self.node, f"gpu_idle:{slot}:{holder.job}", since), self.node, EventKind.GPU_IDLE,
            now, slot,
            message=f"GPU {gpu} allocated to Slurm job {holder.job}{owner} has been idle (utilisation <= "
                    f"{self.max_util_pct:g} %) for {minutes:.0f} min, {held}",
            source="nvml", attrs=tuple(attrs))
