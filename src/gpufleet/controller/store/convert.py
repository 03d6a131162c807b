"""Row <-> domain conversions (kept apart so the repository reads as queries)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from gpufleet.domain.events import EventKind, HealthEvent, Severity
from gpufleet.lifecycle.decisions import ActionKind, Decision, DecisionStatus, PlannedAction
from gpufleet.lifecycle.engine import NodeRecord
from gpufleet.lifecycle.plan import AuditEntry, OutboxAction
from gpufleet.lifecycle.states import Actor, NodeState, Transition

from .models import ActionRow, DecisionRow, EventRow, NodeRow

# Append-only rows (events, transitions, audit) are written as plain column dicts with one Core
# executemany INSERT: no ORM objects, no unit-of-work bookkeeping on the ingest path.
Values = dict[str, Any]


def event_values(e: HealthEvent, received: datetime) -> Values:
    """A row: ``severity`` holds the controller's judgement (what operators read), and what the source
    itself stated, if anything, is kept in ``attrs.stated``."""
    attrs = dict(e.attrs)
    if e.severity is not None:
        attrs["stated"] = e.severity.value
    judged = e.judgement.severity if e.judgement is not None else e.severity
    return {"id": e.id, "node": e.node, "kind": e.kind.value, "time": e.time, "component": e.component,
            "code": e.code, "severity": judged.value if judged else None, "link": e.link,
            "message": e.message, "source": e.source, "attrs": attrs, "received": received}


def event_of(r: EventRow) -> HealthEvent:
    """The stored event as it arrived (``severity``: what its source stated; the judgement is not
    rebuilt: whoever needs it judges again with the catalog of the day)."""
    return event_from(r.id, r.node, r.kind, r.time, r.component, r.code, r.link, r.message, r.source, r.attrs)


#: The columns :func:`event_from` takes, in its order: a plain (Core) select of them skips the ORM's
#: objects, 3.5-4x cheaper per event for the long reads (the correlator's replay; decision 0113).
EVENT_COLUMNS = (EventRow.id, EventRow.node, EventRow.kind, EventRow.time, EventRow.component, EventRow.code,
                 EventRow.link, EventRow.message, EventRow.source, EventRow.attrs)


def event_from(eid: str, node: str, kind: str, time: datetime, component: str | None, code: int | None,
               link: str | None, message: str, source: str, attrs: Mapping[str, Any] | None) -> HealthEvent:
    """A stored event from its columns (:data:`EVENT_COLUMNS`)."""
    kept = {str(k): str(v) for k, v in (attrs or {}).items()}
    stated = kept.pop("stated", None)
    return HealthEvent(
        id=eid, node=node, kind=EventKind(kind), time=time, component=component, code=code,
        severity=Severity(stated) if stated in _SEVERITIES else None, link=link, message=message,
        source=source, attrs=tuple(sorted(kept.items())),
    )


_SEVERITIES = frozenset(s.value for s in Severity)


def decision_row(d: Decision) -> DecisionRow:
    return DecisionRow(
        id=d.id, node=d.node, time=d.time, from_state=d.from_state.value, to_state=d.to_state.value, rule=d.rule,
        reason=d.reason, severity=d.severity.value, actor=d.actor.value, actor_id=d.actor_id,
        evidence=list(d.evidence), actions=[[a.kind.value, a.node, a.reason, a.level] for a in d.actions],
        status=d.status.value,
    )


def decision_of(r: DecisionRow) -> Decision:
    return Decision(
        id=r.id, node=r.node, time=r.time, from_state=NodeState(r.from_state), to_state=NodeState(r.to_state),
        rule=r.rule, reason=r.reason, severity=Severity(r.severity), actor=Actor(r.actor), actor_id=r.actor_id,
        evidence=tuple(r.evidence), actions=tuple(PlannedAction(ActionKind(a[0]), a[1], a[2], a[3]) for a in r.actions),
        status=DecisionStatus(r.status),
    )


def transition_values(t: Transition) -> Values:
    return {"node": t.node, "from_state": t.from_state.value, "to_state": t.to_state.value, "time": t.time,
            "reason": t.reason, "actor": t.actor.value, "actor_id": t.actor_id, "evidence": list(t.evidence),
            "decision_id": t.decision_id}


def audit_values(a: AuditEntry) -> Values:
    return {"time": a.time, "actor": a.actor.value, "actor_id": a.actor_id, "action": a.action,
            "target": a.target, "detail": a.detail}


def record_of(r: NodeRow) -> NodeRecord:
    return NodeRecord(node=r.id, state=NodeState(r.state), since=r.since, domains=frozenset(r.domains),
                      has_jobs=r.has_jobs, committed=r.committed)


def planned_of(r: ActionRow) -> PlannedAction:
    return PlannedAction(ActionKind(r.kind), r.node, r.reason, r.level)


def outbox_of(r: ActionRow) -> OutboxAction:
    """An outbox row as the typed action the reconciler executes."""
    progress = {str(k): str(v) for k, v in (r.progress or {}).items()}
    return OutboxAction(r.id, r.decision_id, planned_of(r), r.created, r.attempts, progress)
