"""Tenancy routes (docs/tenancy.md, docs/api.md).

* ``POST /v1/nodes/{node}/tenant`` ``{"to": "TENANT", "reason": "..."}`` (admin) — move the node to
  another tenant: drain, wipe, validation, then handover (controller.tenancy). 202 with the move; 409
  while it is being moved, when it is not serving, or when ``[tenancy] wipe`` is not configured. There
  is no route that sets a node's tenant directly.
* ``GET /v1/tenancy`` (viewer) — the tenants (each one's nodes now and partition key) and the moves,
  newest first. A tenant-scoped token sees its own tenant and the moves of the nodes it owns now.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, status
from pydantic import BaseModel, ConfigDict, Field

from gpufleet.controller.store.tenancy import Move
from gpufleet.controller.tenancy import Tenancy
from gpufleet.domain.errors import Conflict

from .auth import ADMINISTER, READ, Caller, require
from .schemas import Name, Text
from .scope import Scope

Reader = Annotated[Caller, Depends(require(READ))]
Admin = Annotated[Caller, Depends(require(ADMINISTER))]


class MoveIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    to: Name = Field(description="the tenant the node moves to (a [[tenant]] name)")
    reason: Text = Field(default="", max_length=500)


class MoveOut(BaseModel):
    id: str
    node: str
    from_tenant: str | None
    to_tenant: str
    rollout: str  # the maintenance rollout that drains, wipes and validates it (GET /v1/maintenance/{id})
    state: str  # running | done | failed
    detail: str
    actor: str
    created: datetime
    updated: datetime


class TenantOut(BaseModel):
    name: str
    pkey: str | None
    nodes: list[str]


class TenancyOut(BaseModel):
    tenants: list[TenantOut]
    moves: list[MoveOut]


def _out(m: Move) -> MoveOut:
    return MoveOut(id=m.id, node=m.node, from_tenant=m.from_tenant, to_tenant=m.to_tenant, rollout=m.rollout,
                   state=m.state, detail=m.detail, actor=m.actor, created=m.created, updated=m.updated)


def tenancy_router(tenancy: Tenancy | None, scope: Scope) -> APIRouter:
    r = APIRouter()

    @r.post("/nodes/{node}/tenant", status_code=status.HTTP_202_ACCEPTED, response_model=MoveOut,
            summary="Move a node to another tenant: drain, wipe, validate, hand over (admin)")
    def move(node: Name, body: MoveIn, caller: Admin) -> MoveOut:
        if tenancy is None:
            raise Conflict("tenancy moves need the reconciler (a controller started with a scheduler)")
        return _out(tenancy.move(node, body.to, f"{caller.role}:{caller.name}", body.reason))

    @r.get("/tenancy", response_model=TenancyOut, summary="Tenants, their nodes and the moves (viewer)")
    def overview(caller: Reader) -> TenancyOut:
        if tenancy is None:
            return TenancyOut(tenants=[], moves=[])
        tenants = [t for t in tenancy.tenants if caller.tenant in (None, t.name)]
        within = scope.within(caller)
        return TenancyOut(
            tenants=[TenantOut(name=t.name, pkey=None if t.pkey is None else f"0x{t.pkey:04x}",
                               nodes=sorted(tenancy.nodes_of(t.name))) for t in tenants],
            moves=[_out(m) for m in tenancy.store.moves(nodes=within)])

    return r
