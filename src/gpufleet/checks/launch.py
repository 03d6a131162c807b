"""Where this process sits in a multi-node launch, read from the launcher's environment. Pure.

Understood launchers (first match wins):

* **torchrun** (and anything that sets the same variables): ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``.
* **srun**: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NTASKS_PER_NODE`` or
  ``SLURM_TASKS_PER_NODE``; the rendezvous host is ``MASTER_ADDR`` if set, else the first host of
  ``SLURM_STEP_NODELIST`` / ``SLURM_JOB_NODELIST``; the port is ``MASTER_PORT`` if set, else
  ``20000 + SLURM_JOB_ID % 10000`` (so two jobs on one node do not collide).

``GPUFLEET_NODE_NAME`` overrides the node name (default: the host name). ``GPUFLEET_CHECK_TEST_DELAY``
(``"RANK=SECONDS[,RANK=SECONDS]"``) is a deliberate per-rank slow-down used only by the test suite to
play a slow peer; it is never set in production.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpufleet.domain.errors import InvalidInput

DEFAULT_PORT = 29500
TEST_DELAY_VAR = "GPUFLEET_CHECK_TEST_DELAY"


@dataclass(frozen=True, slots=True)
class LaunchEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    node: str
    launcher: str  # "torchrun", "srun" or "single"


def _int(env: Mapping[str, str], name: str, default: int | None = None, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise InvalidInput(name, raw, "set by the launcher (torchrun or srun)")
        return default
    try:
        value = int(raw)
    except ValueError as err:
        raise InvalidInput(name, raw, "an integer") from err
    if value < minimum:
        raise InvalidInput(name, raw, f"an integer >= {minimum}")
    return value


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: ``"gpu[003-010,12],cpu1"`` -> ``"gpu003"``."""
    text = nodelist.strip()
    m = re.match(r"^([^,\[]*)(?:\[([^\]]+)\])?([^,]*)", text)
    if not text or m is None or not (m.group(1) or m.group(2)):
        raise InvalidInput("SLURM_JOB_NODELIST", nodelist, "a Slurm host list such as gpu[001-004]")
    prefix, ranges, suffix = m.group(1), m.group(2), m.group(3)
    if ranges is None:
        return prefix + suffix
    first = ranges.split(",")[0].split("-")[0]
    return f"{prefix}{first}{suffix}"


def _tasks_per_node(value: str) -> int:
    """``SLURM_TASKS_PER_NODE`` such as ``"8(x4)"`` or ``"8,8"``: the first count."""
    m = re.match(r"^(\d+)", value.strip())
    if m is None:
        raise InvalidInput("SLURM_TASKS_PER_NODE", value, "a task count such as 8 or 8(x4)")
    return int(m.group(1))


def launch_env(env: Mapping[str, str], hostname: str) -> LaunchEnv:
    """Parse ``env`` (pass ``os.environ``); ``hostname`` names the node unless overridden."""
    node = env.get("GPUFLEET_NODE_NAME") or hostname
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _int(env, "WORLD_SIZE", minimum=1)
        rank = _int(env, "RANK")
        if rank >= world:
            raise InvalidInput("RANK", rank, f"less than WORLD_SIZE ({world})")
        local = _int(env, "LOCAL_RANK", 0)
        return LaunchEnv(
            rank=rank,
            world_size=world,
            local_rank=local,
            local_world_size=_int(env, "LOCAL_WORLD_SIZE", 1, minimum=1),
            master_addr=env.get("MASTER_ADDR") or "127.0.0.1",
            master_port=_int(env, "MASTER_PORT", DEFAULT_PORT, minimum=1),
            node=node,
            launcher="torchrun",
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        world = _int(env, "SLURM_NTASKS", minimum=1)
        rank = _int(env, "SLURM_PROCID")
        if rank >= world:
            raise InvalidInput("SLURM_PROCID", rank, f"less than SLURM_NTASKS ({world})")
        if env.get("SLURM_NTASKS_PER_NODE"):
            per_node = _int(env, "SLURM_NTASKS_PER_NODE", minimum=1)
        elif env.get("SLURM_TASKS_PER_NODE"):
            per_node = _tasks_per_node(env["SLURM_TASKS_PER_NODE"])
        else:
            per_node = 1
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
        master = env.get("MASTER_ADDR") or (first_host(nodelist) if nodelist else "127.0.0.1")
        job = _int(env, "SLURM_JOB_ID", 0)
        port = _int(env, "MASTER_PORT", 20000 + job % 10000, minimum=1)
        return LaunchEnv(
            rank=rank,
            world_size=world,
            local_rank=_int(env, "SLURM_LOCALID", 0),
            local_world_size=per_node,
            master_addr=master,
            master_port=port,
            node=node,
            launcher="srun",
        )
    return LaunchEnv(0, 1, 0, 1, "127.0.0.1", DEFAULT_PORT, node, "single")


def injected_delay(env: Mapping[str, str], rank: int) -> float:
    """Seconds of deliberate delay per timed iteration for ``rank`` (tests only; 0 when unset)."""
    raw = env.get(TEST_DELAY_VAR, "").strip()
    if not raw:
        return 0.0
    delays: dict[int, float] = {}
    for part in raw.split(","):
        key, sep, value = part.partition("=")
        try:
            if not sep:
                raise ValueError(part)
            delays[int(key)] = float(value)
        except ValueError as err:
            raise InvalidInput(TEST_DELAY_VAR, raw, "RANK=SECONDS[,RANK=SECONDS]") from err
    return max(0.0, delays.get(rank, 0.0))
