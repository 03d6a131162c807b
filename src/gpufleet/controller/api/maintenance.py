"""Maintenance rollouts (docs/maintenance.md): protected rolling maintenance through the controller.

* ``POST /v1/maintenance`` (operator) — plan a rollout: ``{"selector": "all" | "rack:R" | "switch:S" |
  "nodes:a,b", "action": "reboot" | "script:NAME", "max_unavailable": 1, "max_unavailable_domain": 1,
  "on_failure": "stop" | "continue", "validate": "full" | "quick", "drain_timeout": "2h",
  "action_timeout": "30m", "validate_timeout": "3h"}``. Nothing happens until it is started; the answer
  shows the batches it would run in now.
* ``GET /v1/maintenance?limit=`` (viewer) — the rollouts, newest first (100 unless said), each with its
  nodes counted per step; ``GET /v1/maintenance/{id}`` — one, with each node's step, why pending nodes
  wait, and the batches still to come.
* ``POST /v1/maintenance/{id}/start`` | ``/pause`` | ``/abort`` (operator; optional ``{"reason"}``).

A bad field answers 422 naming the field, the value and what was expected; a state that does not
allow the call (pausing a planned rollout) answers 409.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from gpufleet.controller.maintenance import Maintenance
from gpufleet.controller.store.maintenance import Rollout
from gpufleet.domain.errors import NotFound

from .auth import OPERATE, READ, Caller, require
from .schemas import Limit, Name, ReasonIn
from .scope import Scope

Reader = Annotated[Caller, Depends(require(READ))]
Operator = Annotated[Caller, Depends(require(OPERATE))]


class RolloutIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    selector: str = Field(max_length=20_000, description="all | rack:R | switch:S | nodes:a,b,...")
    action: str = Field(max_length=64, description="reboot | script:NAME (a script the agent's config names)")
    max_unavailable: int | None = None
    max_unavailable_domain: int | None = None
    on_failure: str | None = None
    validate_level: str | None = Field(default=None, alias="validate")
    drain_timeout: str | float | None = None
    action_timeout: str | float | None = None
    validate_timeout: str | float | None = None


class NodeStepOut(BaseModel):
    node: str
    step: str
    since: datetime
    detail: str
    command: str
    waiting: str = ""  # pending: why it has not started (the last pass)


class RolloutSummaryOut(BaseModel):
    """A rollout in the list: its nodes counted per step (``GET /v1/maintenance/{id}`` lists them)."""

    id: str
    state: str
    reason: str
    spec: dict[str, object]
    actor: str
    created: datetime
    updated: datetime
    counts: dict[str, int]


class RolloutOut(RolloutSummaryOut):
    nodes: list[NodeStepOut]
    batches: list[list[str]]  # the pending nodes' batches if nothing else changed
    last_pass: datetime | None


def maintenance_router(maintenance: Maintenance, scope: Scope) -> APIRouter:
    r = APIRouter()
    m = maintenance

    def out(x: Rollout) -> RolloutOut:
        waiting = m.waiting.get(x.id, {})
        counts: dict[str, int] = {}
        for n in x.nodes:
            counts[n.step.value] = counts.get(n.step.value, 0) + 1
        return RolloutOut(id=x.id, state=x.state.value, reason=x.reason, spec=x.spec.as_dict(), actor=x.actor,
                          created=x.created, updated=x.updated, counts=counts,
                          nodes=[NodeStepOut(node=n.node, step=n.step.value, since=n.since, detail=n.detail,
                                             command=n.command, waiting=waiting.get(n.node, "")) for n in x.nodes],
                          batches=m.preview(x), last_pass=m.last_pass)

    def who(caller: Caller) -> str:
        return f"{caller.role}:{caller.name}"

    @r.post("/maintenance", response_model=RolloutOut, status_code=201,
            summary="Plan a maintenance rollout (operator); start it with /start")
    def plan(body: RolloutIn, caller: Operator) -> RolloutOut:
        scope.fleet(caller, "planning maintenance")
        return out(m.plan(body.model_dump(exclude_none=True, by_alias=True), who(caller)))

    @r.get("/maintenance", response_model=list[RolloutSummaryOut],
           summary="Maintenance rollouts, newest first, their nodes counted per step (viewer)")
    def rollouts(caller: Reader, limit: Limit = 100) -> list[RolloutSummaryOut]:
        # a tenant: the rollouts of its own nodes only
        return [RolloutSummaryOut(id=x.id, state=x.state.value, reason=x.reason, spec=x.spec.as_dict(), actor=x.actor,
                                  created=x.created, updated=x.updated, counts=x.counts)
                for x in m.store.summaries(limit=limit, within=scope.within(caller))]

    @r.get("/maintenance/{rollout}", response_model=RolloutOut, summary="One maintenance rollout (viewer)")
    def status(rollout: Name, caller: Reader) -> RolloutOut:
        x = m.store.get(rollout)
        if not all(scope.sees(caller, n.node) for n in x.nodes):
            raise NotFound("maintenance rollout", rollout)
        return out(x)

    @r.post("/maintenance/{rollout}/start", response_model=RolloutOut,
            summary="Start (or go on with) a planned, paused or stopped rollout (operator)")
    def start(rollout: Name, caller: Operator) -> RolloutOut:
        scope.fleet(caller, "starting maintenance")
        return out(m.start(rollout, who(caller)))

    @r.post("/maintenance/{rollout}/pause", response_model=RolloutOut,
            summary="Pause a running rollout: no node starts, no action is sent (operator)")
    def pause(rollout: Name, caller: Operator, body: ReasonIn | None = None) -> RolloutOut:
        scope.fleet(caller, "pausing maintenance")
        return out(m.pause(rollout, who(caller), body.reason if body else ""))

    @r.post("/maintenance/{rollout}/abort", response_model=RolloutOut,
            summary="Abort a rollout: pending nodes are skipped, drained ones return (operator)")
    def abort(rollout: Name, caller: Operator, body: ReasonIn | None = None) -> RolloutOut:
        scope.fleet(caller, "aborting maintenance")
        return out(m.abort(rollout, who(caller), body.reason if body else ""))

    return r
