"""The executor port: how the controller carries out one repair step on a node.

Implementations: :class:`~gpufleet.controller.executors.agent.AgentExecutor` (GPU reset, reboot,
fabric-manager restart, run by the node's own agent over the authenticated command channel) and
:class:`~gpufleet.controller.executors.ticket.TicketExecutor` (hands the node to people with a
webhook) and :class:`~gpufleet.controller.executors.bmc.BmcExecutor` (power cycle through the node's
BMC, Redfish).

Consistency and failure behaviour (the contract):

* **Idempotent on the key.** ``start`` may be called again with the same :attr:`StepRequest.key`
  after a crash; it must not carry the step out twice (the agent queue keys commands by it; the
  ticket webhook sends it as ``id`` and ``Idempotency-Key`` for the receiver to deduplicate).
  The caller records the key before it calls ``start``.
* **Failures.** ``start`` raises :class:`~gpufleet.domain.errors.ExternalError` for a retryable
  failure (receiver unreachable, 5xx) and :class:`~gpufleet.domain.errors.Conflict` for one that
  will not go away by retrying (the receiver refused the request). The repairer retries a step's
  ``start`` ``start_tries`` times with backoff, then counts the step as failed (the next rung).
* **Results.** ``outcome`` returns None while the step is still running, else whether it worked and
  a one-line detail. A step that worked is not a verdict on the node: the node is validated next.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from gpufleet.lifecycle.repair import Fault, RepairAttempt, RepairStep


@dataclass(frozen=True, slots=True)
class StepRequest:
    key: str  # <outbox action id>:<attempt>:<step>: the dedup key
    node: str
    step: RepairStep
    fault: Fault
    reason: str  # why this rung (lifecycle.repair.NextStep.reason)
    time: datetime
    lemon: bool = False  # a retire recommendation
    history: tuple[RepairAttempt, ...] = ()
    bundle: str = ""  # the diagnostic bundle captured when the node entered repair ("" = none)


@dataclass(frozen=True, slots=True)
class StepOutcome:
    ok: bool
    detail: str


class Executor(Protocol):
    name: str

    def start(self, req: StepRequest) -> None: ...

    def outcome(self, req: StepRequest) -> StepOutcome | None: ...

    def abandon(self, req: StepRequest) -> StepOutcome | None:
        """Give up on a step with no result in time; returns its outcome if it finished meanwhile."""
        ...
