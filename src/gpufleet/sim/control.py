"""The one seam through which node-level health decisions reach the simulator.

The simulator never decides on its own whether a node is drained, kept or returned: every fault,
early warning and finished repair goes to a :class:`NodeControl`, once per event (never per GPU per
tick), and the simulator acts on the verdict. Two implementations:

* :class:`LifecycleControl` — the production path: turns the event into the
  :class:`~gpufleet.domain.events.HealthEvent` an agent would send and asks the lifecycle code
  (``gpufleet.lifecycle``) for its decision.
* :class:`FixedControl` — a fixed rule table (fault -> drain now; warning -> drain at a checkpoint
  when proactive drain is on; repaired -> return), used when the lifecycle code is not importable and
  as the reference in tests.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

from gpufleet.sim.failures import FailureCategory, Scope


class Verdict(StrEnum):
    DRAIN_NOW = "drain_now"  # take the node out now (the job, if any, is interrupted)
    DRAIN_AT_CHECKPOINT = "drain_at_checkpoint"  # the job checkpoints, then restarts without the node
    KEEP = "keep"  # leave the node where it is


class NodeControl(Protocol):
    name: str

    def fault(self, node: str, category: FailureCategory, now: float) -> Verdict:
        """A fault struck ``node`` (``now`` in seconds since the campaign began)."""
        ...

    def warning(self, node: str, category: FailureCategory, now: float) -> Verdict:
        """``node`` shows early signs of a ``category`` fault."""
        ...

    def repaired(self, node: str, now: float) -> bool:
        """Repair of ``node`` finished; True to return it to the pool of spares."""
        ...


class FixedControl:
    """Drain on faults, optionally drain on warnings at a checkpoint, return repaired nodes."""

    name = "fixed"

    def __init__(self, *, proactive_drain: bool = False) -> None:
        self.proactive_drain = proactive_drain
        self.calls = 0

    def fault(self, node: str, category: FailureCategory, now: float) -> Verdict:
        self.calls += 1
        return Verdict.DRAIN_NOW if category.scope is Scope.NODE else Verdict.KEEP

    def warning(self, node: str, category: FailureCategory, now: float) -> Verdict:
        self.calls += 1
        return Verdict.DRAIN_AT_CHECKPOINT if self.proactive_drain else Verdict.KEEP

    def repaired(self, node: str, now: float) -> bool:
        self.calls += 1
        return True
