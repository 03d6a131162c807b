"""Builders shared by the lifecycle tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import count

from gpufleet.domain.events import EventKind, HealthEvent, Severity
from gpufleet.domain.fleet import simulated_fleet
from gpufleet.lifecycle.config import PolicyFile, parse_policy
from gpufleet.lifecycle.engine import LifecycleEngine, NodeRecord
from gpufleet.lifecycle.policy import Policy
from gpufleet.lifecycle.states import NodeState

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
_ids = count()


def ev(node: str, kind: EventKind, at: datetime, code: int | None = None, *,
       severity: Severity | None = None, component: str | None = None) -> HealthEvent:
    return HealthEvent(f"e{next(_ids)}", node, kind, at, component or f"{node}-gpu0", code, severity=severity)


def xid(node: str, code: int, at: datetime) -> HealthEvent:
    return ev(node, EventKind.XID, at, code)


def policy(doc: dict[str, object] | None = None) -> Policy:
    pf: PolicyFile = parse_policy(doc or {})
    return Policy(pf.config, pf.catalog)


def engine(nodes: int = 32, racks: int = 4, state: NodeState = NodeState.READY,
           doc: dict[str, object] | None = None) -> LifecycleEngine:
    fleet = simulated_fleet(nodes, racks)
    recs = [NodeRecord(n.id, state, T0 - timedelta(days=1), n.domains) for n in fleet]
    return LifecycleEngine(policy(doc), recs)
