"""What a scheduler contract test needs besides the port itself: a way to make work happen.

Each implementation (sim, slurm, ...) provides a :class:`SchedulerHarness`; ``conftest.py`` turns
them into the parametrized ``harness`` fixture. The Slurm harness starts real jobs with sbatch; the
Kubernetes one (``tests/k8s/harness.py``) runs the adapter against the fake API server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from gpufleet.schedulers.port import JobState, Scheduler
from gpufleet.schedulers.sim import SimScheduler

if TYPE_CHECKING:
    from gpufleet.schedulers.slurm import SlurmScheduler
    from tests.integration.slurm.lab import SlurmLab


class SchedulerHarness(Protocol):
    scheduler: Scheduler
    nodes: list[str]  # at least 3 nodes, idle and undrained at the start of each test

    def start_job(self, node: str) -> str:
        """Start a long-running job on ``node``; return once the scheduler reports it RUNNING."""
        ...

    def end_job(self, job_id: str) -> None:
        """End the job; return once the scheduler no longer reports it running."""
        ...

    def start_checkpointing_job(self, node: str) -> str:
        """Start a job on ``node`` that handles the checkpoint signal (the training-script contract)."""
        ...

    def checkpoint_requested(self, job_id: str) -> bool:
        """Whether the job has received a checkpoint request (as seen from inside the job)."""
        ...

    def foreign_drain(self, node: str, reason: str) -> None:
        """Drain ``node`` the way a human operator would (not through gpufleet)."""
        ...

    def eventually(self, check: Callable[[], bool], what: str) -> None:
        """Wait until ``check()`` is true (schedulers apply some changes asynchronously)."""
        ...


@dataclass
class SimHarness:
    scheduler: SimScheduler
    nodes: list[str]

    @classmethod
    def create(cls) -> SimHarness:
        nodes = ["n1", "n2", "n3"]
        return cls(SimScheduler(nodes), nodes)

    def start_job(self, node: str) -> str:
        return self.scheduler.submit("contract", [node], start=datetime.now(UTC)).id

    def end_job(self, job_id: str) -> None:
        self.scheduler.finish(job_id)

    def start_checkpointing_job(self, node: str) -> str:
        return self.start_job(node)

    def checkpoint_requested(self, job_id: str) -> bool:
        return self.scheduler.checkpoint_requests(job_id) > 0

    def foreign_drain(self, node: str, reason: str) -> None:
        self.scheduler.drain(node, reason)

    def eventually(self, check: Callable[[], bool], what: str) -> None:
        assert check(), what  # the simulation applies every change synchronously


@dataclass
class SlurmHarness:
    """The real Slurm lab (scripts/slurm-lab.sh): jobs are real sbatch jobs on real slurmd nodes."""

    scheduler: SlurmScheduler
    nodes: list[str]
    lab: SlurmLab

    @classmethod
    def create(cls, lab: SlurmLab, *, rest: bool = False) -> SlurmHarness:
        """``rest``: read nodes and jobs through slurmrestd (unix socket) instead of sinfo/squeue."""
        from gpufleet.schedulers.slurm import SlurmScheduler
        from gpufleet.schedulers.slurm.restd import RestReader

        lab.reset()
        reader = RestReader(socket=str(lab.root / "run" / "slurmrestd.sock")) if rest else None
        return cls(SlurmScheduler(slurm_conf=lab.slurm_conf, reader=reader), list(lab.nodes), lab)

    def start_job(self, node: str) -> str:
        job = self.lab.sbatch(node)
        self.eventually(lambda: self.lab.job_state(job) == "RUNNING", f"job {job} RUNNING on {node}")
        return job

    def end_job(self, job_id: str) -> None:
        self.lab.cmd("scancel", job_id)
        self.eventually(
            lambda: all(j.state != JobState.RUNNING for j in self.scheduler.list_jobs() if j.id == job_id),
            f"job {job_id} no longer running",
        )

    def start_checkpointing_job(self, node: str) -> str:
        flag = self.lab.root / "jobs" / "ckpt-$SLURM_JOB_ID"
        job = self.lab.sbatch(node, f"trap 'touch {flag}' USR1; while true; do sleep 0.2; done")
        self.eventually(lambda: self.lab.job_state(job) == "RUNNING", f"job {job} RUNNING on {node}")
        return job

    def checkpoint_requested(self, job_id: str) -> bool:
        return (self.lab.root / "jobs" / f"ckpt-{job_id}").exists()

    def foreign_drain(self, node: str, reason: str) -> None:
        self.lab.cmd("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")

    def eventually(self, check: Callable[[], bool], what: str) -> None:
        from tests.integration.slurm.lab import wait_for

        wait_for(check, what)
