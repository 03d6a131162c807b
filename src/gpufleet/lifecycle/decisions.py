"""What the policy produces: decisions, and the actions that carry them out."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from gpufleet.domain.events import Severity
from gpufleet.lifecycle.states import Actor, NodeState


class ActionKind(StrEnum):
    DRAIN = "drain"  # stop placing work now; running jobs keep running unless requeued
    DRAIN_AFTER_CHECKPOINT = "drain_after_checkpoint"  # wait for the job's next checkpoint (or end)
    REQUEUE_JOBS = "requeue_jobs"  # requeue every job running on the node
    RESUME = "resume"  # return the node to the scheduler
    VALIDATE = "validate"  # run active checks (burn-in, revalidation)
    REPAIR = "repair"  # climb the repair escalation ladder (lifecycle.repair) until it holds or goes to people


class DecisionStatus(StrEnum):
    APPLIED = "applied"  # transitions recorded, actions queued
    HELD = "held"  # the blast-radius breaker queued it
    DRY_RUN = "dry_run"  # recorded only (dry-run mode)
    CANCELLED = "cancelled"  # an operator discarded it (e.g. after a bad health check)
    # A held decision a correlated group's held decision took the place of: held again if the group's is
    # cancelled for its node (the switch was fine; the node's own fault still stands), else never acted on.
    SUPERSEDED = "superseded"


@dataclass(frozen=True, slots=True)
class PlannedAction:
    kind: ActionKind
    node: str
    reason: str = ""
    level: str = ""  # for VALIDATE: quick | full | burnin


@dataclass(frozen=True, slots=True)
class Decision:
    id: str
    node: str
    time: datetime
    from_state: NodeState
    to_state: NodeState
    rule: str  # which rule fired, e.g. "fatal_event", "escalation", "check_passed"
    reason: str  # human-readable, shown in the audit log and the scheduler's drain reason
    severity: Severity
    actor: Actor = Actor.POLICY
    actor_id: str = "policy"
    evidence: tuple[str, ...] = ()
    actions: tuple[PlannedAction, ...] = ()
    status: DecisionStatus = DecisionStatus.APPLIED

    @property
    def takes_node_out(self) -> bool:
        """True when carrying this decision out makes the node unavailable (counts against the budget)."""
        return any(a.kind in (ActionKind.DRAIN, ActionKind.DRAIN_AFTER_CHECKPOINT) for a in self.actions)


@dataclass(frozen=True, slots=True)
class ComponentFault:
    """A shared component (leaf switch, NVSwitch, cable, tray) found faulty by correlation: every node
    that depends on it is handled as ONE decision (one budget check, one hold, one approval)."""

    component: str
    kind: str
    affected_nodes: tuple[str, ...]
    reason: str
    evidence: tuple[str, ...] = ()
    severity: Severity = Severity.DEGRADED

    @property
    def group(self) -> str:
        return f"correlate:{self.component}"


def decision_id(node: str, rule: str, from_state: NodeState, to_state: NodeState, basis: tuple[str, ...]) -> str:
    """A deterministic id: replaying the same evidence yields the same decision (dedup after a crash)."""
    h = hashlib.sha1("|".join((node, rule, from_state, to_state, *basis)).encode()).hexdigest()[:16]
    return f"d-{h}"


def action_id(decision: str, kind: ActionKind) -> str:
    """The outbox dedup key of one action of one decision."""
    return f"{decision}:{kind}"
