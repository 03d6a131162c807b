"""Simulation sweeps: many policy mixes x many seeds, run in this process, in local worker processes,
or on a Ray cluster, with the same results whichever runs them.

A sweep is a list of *variants* (a label, a :class:`SimConfig`, a :class:`ControlSpec`) and a number of
replicas; replica ``i`` of every variant uses seed ``seed + i`` (common random numbers: variants are
compared on the same failure histories, which narrows the confidence interval of their difference).
Each (variant, seed) is one :class:`Task`, a small picklable value; :func:`run_task` runs one anywhere,
and workers are sent :func:`chunks` of them (about four per worker) so short replicas do not pay a round
trip each. A backend only maps tasks to results:

* :class:`SerialBackend`: this process (tests, tiny sweeps);
* :class:`ProcessBackend`: ``concurrent.futures`` worker processes on this machine;
* :class:`RayBackend`: Ray tasks (``ray.init(address)``; ``"local"`` starts a local Ray instance, as the
  tests do). Ray is an optional dependency, imported only here, only when asked for.

Results come back in any order and are put back in task order, so a sweep's summaries do not depend
on the backend (tests/integration/sim/test_sweep.py checks serial, processes and Ray agree).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from gpufleet.domain.errors import InvalidInput
from gpufleet.sim.config import SimConfig
from gpufleet.sim.control import FixedControl, LifecycleControl, NodeControl
from gpufleet.sim.engine import ReplicaResult, run_replica
from gpufleet.sim.montecarlo import Summary
from gpufleet.sim.trace import FaultTrace

CONTROLS = ("lifecycle", "fixed")


@dataclass(frozen=True, slots=True)
class ControlSpec:
    """Which control decides (the production lifecycle engine with a policy file, or the rule table),
    as a value a worker process can rebuild it from."""

    kind: str = "lifecycle"
    policy: Path | None = None

    def __post_init__(self) -> None:
        if self.kind not in CONTROLS:
            raise InvalidInput("control", self.kind, f"one of {list(CONTROLS)}")

    def build(self, cfg: SimConfig) -> NodeControl:
        if self.kind == "fixed":
            return FixedControl(proactive_drain=cfg.proactive_drain)
        return LifecycleControl(_policy(self.policy), proactive_drain=cfg.proactive_drain,
                                operator_response=cfg.operator_response)


@lru_cache(maxsize=16)
def _policy(path: Path | None) -> Any:
    """A policy file parsed once per worker process (None: every default)."""
    from gpufleet.lifecycle.config import load_policy

    return load_policy(path)


@dataclass(frozen=True, slots=True)
class Variant:
    label: str
    config: SimConfig
    control: ControlSpec = ControlSpec()


@dataclass(frozen=True, slots=True)
class Task:
    index: int  # position in the sweep: results are put back in this order
    variant: int
    seed: int
    config: SimConfig
    control: ControlSpec
    trace: FaultTrace | None = None


def run_task(task: Task) -> tuple[int, ReplicaResult]:
    """One replica, anywhere (a worker process, a Ray worker): silent, deterministic in its seed."""
    import logging

    logging.getLogger("gpufleet.lifecycle").setLevel(logging.ERROR)  # thousands of decisions per replica
    return task.index, run_replica(task.config, task.seed, control=task.control.build(task.config),
                                   trace=task.trace)


def run_chunk(tasks: Sequence[Task]) -> list[tuple[int, ReplicaResult]]:
    """Several tasks in one call: what a worker is sent, so that short replicas do not pay a round
    trip each."""
    return [run_task(t) for t in tasks]


def chunks(tasks: Sequence[Task], workers: int) -> list[Sequence[Task]]:
    """About four chunks per worker (load balance) of consecutive tasks."""
    size = max(1, -(-len(tasks) // (4 * max(1, workers))))
    return [tasks[i:i + size] for i in range(0, len(tasks), size)]


class Backend(Protocol):
    name: str

    def map(self, tasks: Sequence[Task]) -> Iterator[tuple[int, ReplicaResult]]:
        """Every task's result, in any order, as they finish."""
        ...


class SerialBackend:
    name = "serial"

    def map(self, tasks: Sequence[Task]) -> Iterator[tuple[int, ReplicaResult]]:
        return (run_task(t) for t in tasks)


class ProcessBackend:
    """``workers`` local processes (default: one per CPU)."""

    def __init__(self, workers: int | None = None) -> None:
        if workers is not None and workers < 1:
            raise InvalidInput("--workers", workers, "1 or more")
        self.workers = workers or os.cpu_count() or 1
        self.name = f"processes x{self.workers}"

    def map(self, tasks: Sequence[Task]) -> Iterator[tuple[int, ReplicaResult]]:
        with ProcessPoolExecutor(max_workers=self.workers) as pool:
            futures = [pool.submit(run_chunk, c) for c in chunks(tasks, self.workers)]
            for f in as_completed(futures):
                yield from f.result()


class RayBackend:
    """Ray tasks on the cluster at ``address`` (``ray://host:10001``, ``auto``), or on a local Ray
    instance started for the sweep (``local``). gpufleet must be importable on the cluster's workers."""

    def __init__(self, address: str) -> None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise InvalidInput("--ray", address, "Ray installed (pip install 'gpufleet[ray]')") from None
        self.address = address
        self.name = f"ray {address}"

    def map(self, tasks: Sequence[Task]) -> Iterator[tuple[int, ReplicaResult]]:
        import ray

        started_here = not ray.is_initialized()
        if started_here:
            ray.init(address=None if self.address == "local" else self.address, include_dashboard=False,
                     log_to_driver=False, runtime_env=_runtime_env() if self.address == "local" else None)
        try:
            remote = ray.remote(run_chunk)
            cpus = int(ray.cluster_resources().get("CPU", 1))  # type: ignore[no-untyped-call]
            pending = [remote.remote(c) for c in chunks(tasks, cpus)]
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    yield from ray.get(ref)
        finally:
            if started_here:
                ray.shutdown()


def _runtime_env() -> dict[str, Any]:
    """A local Ray instance's workers import gpufleet from where this process does."""
    import gpufleet

    src = str(Path(gpufleet.__file__).resolve().parents[1])
    path = os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])
    return {"env_vars": {"PYTHONPATH": path}}


def backend_for(workers: int | None, ray_address: str | None) -> Backend:
    if ray_address:
        return RayBackend(ray_address)
    if workers == 1:
        return SerialBackend()
    return ProcessBackend(workers)


def tasks_of(variants: Sequence[Variant], replicas: int, seed: int, trace: FaultTrace | None = None) -> list[Task]:
    if replicas < 1:
        raise InvalidInput("--replicas", replicas, "1 or more")
    out: list[Task] = []
    for v, var in enumerate(variants):
        for i in range(replicas):
            out.append(Task(len(out), v, seed + i, var.config, var.control, trace))
    return out


def run_sweep(variants: Sequence[Variant], replicas: int, seed: int, backend: Backend, *,
              trace: FaultTrace | None = None, progress: Callable[[int], None] | None = None) -> list[Summary]:
    """One :class:`Summary` per variant, in the variants' order, each over ``replicas`` seeds."""
    tasks = tasks_of(variants, replicas, seed, trace)
    results: list[ReplicaResult | None] = [None] * len(tasks)
    for done, (index, result) in enumerate(backend.map(tasks), start=1):
        results[index] = result
        if progress is not None:
            progress(done)
    return [Summary(var.config, tuple(_take(results, v, replicas)), var.label) for v, var in enumerate(variants)]


def _take(results: Sequence[ReplicaResult | None], variant: int, replicas: int) -> Iterable[ReplicaResult]:
    for r in results[variant * replicas:(variant + 1) * replicas]:
        if r is None:  # pragma: no cover - a backend that lost a task is a bug, never a silent gap
            raise RuntimeError("a sweep task returned no result")
        yield r
