"""Builders for the rows a plan carries (decision, transition, outbox action, audit, node, event)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpufleet.domain.events import EventKind, HealthEvent, Severity
from gpufleet.lifecycle.breaker import BreakerState
from gpufleet.lifecycle.decisions import ActionKind, Decision, PlannedAction, action_id
from gpufleet.lifecycle.engine import NodeRecord
from gpufleet.lifecycle.plan import AuditEntry, OutboxAction, Plan
from gpufleet.lifecycle.states import Actor, NodeState, transition

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def event(eid: str, node: str = "r01-n01", *, kind: EventKind = EventKind.XID, code: int | None = 79,
          at: datetime = T0) -> HealthEvent:
    return HealthEvent(eid, node, kind, at, component=f"{node}-gpu0", code=code, message=f"event {eid}")


def node_record(node: str, state: NodeState = NodeState.READY, at: datetime = T0) -> NodeRecord:
    return NodeRecord(node, state, at, frozenset({"rack:r01"}))


def drain_plan(node: str, did: str, at: datetime = T0, *, evidence: tuple[str, ...] = ("e1",)) -> Plan:
    """What the engine produces for a fatal event on a ready node: one of every kind of row."""
    drain = PlannedAction(ActionKind.DRAIN, node, "xid 79: fatal")
    requeue = PlannedAction(ActionKind.REQUEUE_JOBS, node, "xid 79: fatal")
    d = Decision(did, node, at, NodeState.READY, NodeState.DRAINING, "fatal_event", "xid 79: fatal",
                 Severity.FATAL, evidence=evidence, actions=(drain, requeue))
    t = transition(node, NodeState.READY, NodeState.DRAINING, time=at, reason="xid 79: fatal", actor=Actor.POLICY,
                   actor_id="policy", evidence=evidence, decision_id=did)
    return Plan(
        decisions=[d], transitions=[t],
        actions=[OutboxAction(action_id(did, a.kind), did, a, at + timedelta(microseconds=i))
                 for i, a in enumerate(d.actions)],
        audit=[AuditEntry(at, Actor.POLICY, "policy", "decision", node, "fatal_event: ready -> draining")],
        breaker=BreakerState(True, "fleet budget: test", at),
        dry_run=True,
    )
