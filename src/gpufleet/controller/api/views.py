"""API responses (pydantic, read from store rows with ``from_attributes``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class NodeOut(_Out):
    id: str
    rack: str
    domains: list[str]
    state: str
    since: datetime
    has_jobs: bool
    last_heartbeat: datetime | None
    agent_version: str


class TransitionOut(_Out):
    seq: int
    node: str
    from_state: str
    to_state: str
    time: datetime
    reason: str
    actor: str
    actor_id: str
    evidence: list[Any]
    decision_id: str | None


class EventOut(_Out):
    seq: int
    id: str
    node: str
    kind: str
    time: datetime
    component: str | None
    code: int | None
    severity: str | None
    link: str | None
    message: str
    source: str
    attrs: dict[str, Any]
    received: datetime
    fault_of: str | None = None  # merged onto this event id (same node): another source saw it first


class DecisionOut(_Out):
    id: str
    node: str
    time: datetime
    from_state: str
    to_state: str
    rule: str
    reason: str
    severity: str
    actor: str
    actor_id: str
    evidence: list[Any]
    actions: list[Any]
    status: str


class ActionOut(_Out):
    id: str
    decision_id: str
    node: str
    kind: str
    reason: str
    level: str
    status: str
    attempts: int
    next_attempt: datetime
    last_error: str
    result: str
    created: datetime
    updated: datetime
    # What a long-running action has done so far: for a drain waiting for a checkpoint, when the job
    # was asked, its GPUs, the GPU-hours at risk and the deadline (docs/lifecycle.md).
    progress: dict[str, str] | None = None


class AuditOut(_Out):
    seq: int
    time: datetime
    actor: str
    actor_id: str
    action: str
    target: str
    detail: str


class NodeDetail(BaseModel):
    node: NodeOut
    history: list[TransitionOut]
    events: list[EventOut]
    decisions: list[DecisionOut]
    actions: list[ActionOut]


class BreakerOut(BaseModel):
    tripped: bool
    reason: str
    since: datetime | None
    held: int
    # serving in gpufleet, drained or down in the scheduler (an operator's drain, the health-check hook's):
    # counted against the budget as out
    out_in_scheduler: list[str] = []


class StatusOut(BaseModel):
    nodes: dict[str, int]
    actions: dict[str, int]
    events: int
    breaker: BreakerOut
    dry_run: bool
    scheduler_reachable: bool
    ingest_queued: int = 0  # events (and heartbeats) waiting for the writer
    refused: dict[str, int] = {}  # requests refused since start, by reason (body_too_large, unauthenticated, ...)
    max_clock_skew_s: float = 0.0  # the largest |agent clock - controller clock| at the agents' last heartbeats
