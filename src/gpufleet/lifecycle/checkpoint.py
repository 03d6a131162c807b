"""How long a drain waits for the checkpoint it asked for: a budget of GPU-hours at risk.

When a degraded node runs a job, the controller asks the job to checkpoint now (a signal through the
scheduler) and drains the node once the checkpoint is reported. Waiting is not free: the node is
degraded, and everything the job computed since its last checkpoint is lost if the node fails
during the wait. That loss is the **GPU-hours at risk**, ``GPUs of the job x time since its last
checkpoint``; the wait ends when it reaches the policy's budget (``checkpoint_risk_budget``).

Two bounds keep the budget sane: the job always gets ``checkpoint_grace`` after the request to write
its checkpoint (a large job already over the budget when asked still deserves the time to save what
it has), and the node never runs longer than ``checkpoint_wait_timeout`` after the drain was
decided. Pure: times are passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpufleet.domain.errors import InvalidInput

_HOUR = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class CheckpointWait:
    """One drain's wait: when the job was asked, how big it is, what it had saved, and the limits."""

    decided: datetime  # when the drain was decided (the timeout counts from here)
    requested: datetime  # when the job was asked to checkpoint (the grace counts from here)
    jobs: tuple[str, ...]
    gpus: int  # GPUs of the job(s) on the node's allocation (the work at risk)
    basis: datetime  # the last checkpoint known when asked, else the job's start, else ``requested``
    budget_gpu_hours: float
    grace: timedelta
    timeout: timedelta
    signal: str = ""

    def at_risk(self, now: datetime) -> float:
        """GPU-hours lost if the node failed at ``now`` (before a new checkpoint)."""
        return self.gpus * max(timedelta(0), now - self.basis) / _HOUR

    @property
    def deadline(self) -> datetime:
        """When to stop waiting: the budget is used up, but not before the grace nor after the timeout."""
        cap = self.decided + self.timeout
        if self.gpus <= 0:
            return cap
        by_budget = self.basis + _HOUR * (self.budget_gpu_hours / self.gpus)
        return min(cap, max(self.requested + self.grace, by_budget))

    def progress(self, now: datetime) -> dict[str, str]:
        """The record kept on the outbox action (and shown by ``GET /v1/actions``)."""
        return {
            "decided": self.decided.isoformat(),
            "checkpoint_requested": self.requested.isoformat(),
            "signal": self.signal,
            "jobs": ",".join(self.jobs),
            "gpus": str(self.gpus),
            "risk_basis": self.basis.isoformat(),
            "budget_gpu_hours": f"{self.budget_gpu_hours:g}",
            "gpu_hours_at_risk": f"{self.at_risk(now):.2f}",
            "grace": str(self.grace),
            "timeout": str(self.timeout),
            "deadline": self.deadline.isoformat(),
        }

    @classmethod
    def of_progress(cls, p: Mapping[str, str], *, grace: timedelta, timeout: timedelta) -> CheckpointWait | None:
        """The wait a progress record describes, or None when the job was not asked yet. The limits
        come from the current policy (a changed policy applies to waits in progress too)."""
        if "checkpoint_requested" not in p:
            return None
        try:
            return cls(datetime.fromisoformat(p["decided"]), datetime.fromisoformat(p["checkpoint_requested"]),
                       tuple(j for j in p["jobs"].split(",") if j), int(p["gpus"]),
                       datetime.fromisoformat(p["risk_basis"]), float(p["budget_gpu_hours"]),
                       grace, timeout, p.get("signal", ""))
        except (KeyError, ValueError) as err:
            raise InvalidInput("action.progress", dict(p), f"a checkpoint-wait record ({err})") from None


def job_gpus(reported: int, nodes: int, gpus_per_node: int) -> int:
    """The GPUs a job holds: what the scheduler reports, else its nodes x ``gpus_per_node``."""
    return reported if reported > 0 else max(1, nodes) * gpus_per_node
