"""The output of one engine step: everything the controller persists in ONE transaction."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from gpufleet.lifecycle.breaker import BreakerState
from gpufleet.lifecycle.decisions import Decision, DecisionStatus, PlannedAction
from gpufleet.lifecycle.states import Actor, Transition


@dataclass(frozen=True, slots=True)
class OutboxAction:
    id: str  # the dedup key: <decision id>:<kind>
    decision_id: str
    action: PlannedAction
    created: datetime
    attempts: int = 0  # how often the reconciler tried it (read back from the outbox)
    # What a long-running action did so far (e.g. when it asked a job to checkpoint), read back from
    # the outbox so a restarted controller resumes it instead of doing it again.
    progress: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AuditEntry:
    time: datetime
    actor: Actor
    actor_id: str
    action: str  # e.g. "decision", "transition", "breaker_trip", "operator_drain"
    target: str  # node id, decision id, "breaker", ...
    detail: str


@dataclass(slots=True)
class Plan:
    decisions: list[Decision] = field(default_factory=list)
    status_changes: list[tuple[str, DecisionStatus]] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    actions: list[OutboxAction] = field(default_factory=list)
    audit: list[AuditEntry] = field(default_factory=list)
    breaker: BreakerState | None = None  # set when the breaker changed
    dry_run: bool | None = None  # set when the mode changed
    stale_events: int = 0  # degraded/fatal events not acted on: older than the node's last transition

    def extend(self, other: Plan) -> None:
        self.stale_events += other.stale_events
        self.decisions += other.decisions
        self.status_changes += other.status_changes
        self.transitions += other.transitions
        self.actions += other.actions
        self.audit += other.audit
        if other.breaker is not None:
            self.breaker = other.breaker
        if other.dry_run is not None:
            self.dry_run = other.dry_run

    def __bool__(self) -> bool:
        return bool(self.decisions or self.status_changes or self.transitions or self.actions or self.audit
                    or self.breaker is not None or self.dry_run is not None)
