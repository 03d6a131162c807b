"""The scheduler port: how the controller acts on a cluster scheduler (Slurm, Kubernetes, simulated).

Every implementation passes ``tests/contract/test_scheduler_contract.py``.

Consistency and failure behaviour (the contract):

* **Idempotent.** ``drain`` of a node already drained *by gpufleet* is a no-op; ``resume`` of a node
  that is not drained is a no-op. The reconciler may call either again after a crash. ``drain`` returns
  whether it changed the node: ``True`` when this call drained it, ``False`` when it already was
  drained (by anyone) and was left as it is — what a caller that reports drains (the Slurm health-check
  hook, run every few seconds) needs to say "drained" once.
* **Ownership.** gpufleet drains with a reason that starts with :data:`REASON_PREFIX` and carries the
  decision id. ``resume`` never clears a drain whose reason does not start with the prefix (someone
  else drained it): it raises :class:`~gpufleet.domain.errors.Conflict` and leaves the node alone.
  ``drain`` of a node drained by someone else keeps their reason and succeeds (the node is out either
  way) — :attr:`SchedNode.foreign_drain` reports it. ``drain`` of a node that is down (not drained) for
  someone else's reason drains it with gpufleet's reason followed by theirs (:func:`keeping_reason`:
  ``<gpufleet's>; before: <theirs>``, decision 0131): the drain is gpufleet's, their words stay.
* **Failures are exceptions, not silence.** An unreachable scheduler raises
  :class:`~gpufleet.domain.errors.ExternalError` (retryable); an unknown node raises
  :class:`~gpufleet.domain.errors.NotFound`. The reconciler records, retries and surfaces both.
* **Checkpoint requests are signals, not guarantees, and opt-in.** ``request_checkpoint`` asks a
  running job to write a checkpoint now by sending it the signal the job *declared* it handles
  (:attr:`Job.checkpoint_signal`; Slurm: the ``gpufleet:signal=USR1`` token in the job's comment),
  else the site-wide default the implementation was built with (off unless configured), and returns
  the signal's name — or ``""`` when it sent nothing: a signal a job does not handle may kill it
  (USR1's default action), so a job that did not opt in is never signalled. The job answers, if it
  does, by reporting the checkpoint (``POST /v1/jobs/{id}/checkpoint`` or ``gpufleet slurm
  checkpoint``). A job that is not running is ``NotFound``; a job that is not asked or ignores the
  request is drained at the deadline (docs/lifecycle.md). The caller records the request before
  making it, so a crash never sends it twice.
* **Placement preference.** ``place_last(node, True)`` keeps a schedulable node last in placement (a
  suspect: its jobs go elsewhere while anything else is free, without draining it); ``False`` undoes
  it. Idempotent; shown as :attr:`SchedNode.placed_last`. Slurm: the node's weight raised by
  ``PLACE_LAST_WEIGHT`` (restored by subtracting it, so a site's own weights survive); Kubernetes: a
  ``gpufleet.io/suspect:PreferNoSchedule`` taint.
* **Reads are snapshots.** ``list_nodes``/``list_jobs`` return what the scheduler says now; a drain
  shows as ``DRAINING`` while jobs still run on the node and ``DRAINED`` once it is empty.
* **Reads scale with what is asked for, not with the queue.** ``list_jobs`` is the whole queue (as
  many objects as jobs: for listings only); the controller's own paths ask for one job (``job``:
  :class:`~gpufleet.domain.errors.NotFound` once the scheduler no longer knows it) or one node's
  (``jobs_on``), and an implementation must answer those without holding the whole queue in memory
  (Slurm: docs/scale.md#jobs-at-scale). ``list_nodes(jobs=False)`` may leave :attr:`SchedNode.jobs`
  empty: the state still says whether a node runs anything (``ALLOCATED``/``DRAINING``). The
  reconciler's every-pass read asks this way, so where listing jobs costs as much as the queue (Slurm)
  the pass reads the nodes only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol, runtime_checkable

REASON_PREFIX = "gpufleet:"


class SchedNodeState(StrEnum):
    IDLE = "idle"
    ALLOCATED = "allocated"  # running at least one job
    DRAINING = "draining"  # drain flag set, jobs still running
    DRAINED = "drained"  # drain flag set, empty
    DOWN = "down"
    UNKNOWN = "unknown"


class JobState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REQUEUED = "requeued"


@dataclass(frozen=True, slots=True)
class SchedNode:
    name: str
    state: SchedNodeState
    reason: str = ""
    jobs: tuple[str, ...] = ()
    placed_last: bool = False  # kept last in placement (Scheduler.place_last)

    @property
    def drained_by_us(self) -> bool:
        return self.state in (SchedNodeState.DRAINING, SchedNodeState.DRAINED) and self.reason.startswith(
            REASON_PREFIX
        )

    @property
    def foreign_drain(self) -> bool:
        return self.state in (SchedNodeState.DRAINING, SchedNodeState.DRAINED) and not self.drained_by_us


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    name: str
    state: JobState
    nodes: tuple[str, ...] = ()
    start_time: datetime | None = None
    last_checkpoint: datetime | None = None  # latest checkpoint the job reported, if any
    restarts: int = 0
    gpus: int = 0  # GPUs allocated to the job (0: the scheduler does not say)
    checkpoint_signal: str = ""  # the signal the job declared it handles to checkpoint ("" = none declared)
    extra: tuple[tuple[str, str], ...] = field(default=())


@dataclass(frozen=True, slots=True)
class RunStatus:
    """Where a validation run stands (the controller's ``Validator.status``): ``ended`` says how it ended
    (one line) once it is over; until then ``pending`` says why it has not started ("" once it runs),
    e.g. Slurm's pending reason ``ReqNodeNotAvail``. ``cancelled``: it ended by a cancel, or the
    scheduler no longer knows it (what a cancelled job that never started leaves, decision 0130)."""

    ended: str | None = None
    pending: str = ""
    cancelled: bool = False


def drain_reason(decision_id: str, text: str) -> str:
    """The scheduler-visible reason for a drain gpufleet makes: ``gpufleet:<decision> <text>``."""
    return f"{REASON_PREFIX}{decision_id} {text}".strip()


BEFORE = "; before: "  # what follows it in a gpufleet reason is the reason the node had before (0128, 0131)


def keeping_reason(reason: str, before: str) -> str:
    """gpufleet's ``reason`` for a node that already has someone else's (``before``: an operator's words on
    a node they set down), kept after it: ``<reason>; before: <before>`` (the form of a drift re-drain,
    decision 0128). A reason of gpufleet's own is replaced, not kept (no chain)."""
    before = " ".join(before.split())
    if not before or before.startswith(REASON_PREFIX):
        return reason
    return f"{reason}{BEFORE}{before}"


@runtime_checkable
class Scheduler(Protocol):
    """Acts on one cluster's scheduler. See the module docstring for the contract."""

    name: str

    def list_nodes(self, *, jobs: bool = True) -> Sequence[SchedNode]: ...

    def node(self, name: str) -> SchedNode: ...

    def list_jobs(self) -> Sequence[Job]: ...

    def job(self, job_id: str) -> Job: ...

    def jobs_on(self, node: str) -> Sequence[Job]: ...

    def drain(self, node: str, reason: str) -> bool: ...

    def resume(self, node: str) -> None: ...

    def requeue(self, job_id: str) -> None: ...

    def signal(self, job_id: str, signal: str) -> None: ...

    def request_checkpoint(self, job_id: str) -> str: ...

    def place_last(self, node: str, last: bool) -> None: ...
