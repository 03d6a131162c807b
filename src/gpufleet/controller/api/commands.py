"""The agent command channel: repair commands a node's agent fetches and answers (docs/api.md).

* ``GET /v1/nodes/{node}/commands`` — the node's queued commands, oldest first (agent for that node;
  an agent token may only read the nodes it may report for).
* ``POST /v1/nodes/{node}/commands/{id}/result`` ``{"ok": bool, "detail": str}`` — the outcome.
  Idempotent for the same result; 409 when the command expired (no result within the step timeout:
  the agent drops it) or already has the other result; 404 for a command of another node.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from gpufleet.controller.service import Controller
from gpufleet.controller.store.repairs import RepairStore
from gpufleet.domain.errors import NotFound

from .auth import REPORT, Caller, require
from .schemas import Text

Reporter = Annotated[Caller, Depends(require(REPORT))]


class CommandOut(BaseModel):
    id: str
    kind: str  # gpu_reset | reboot | restart_fabric_manager
    created: datetime
    status: str


class CommandsOut(BaseModel):
    commands: list[CommandOut]


class CommandResultIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ok: bool
    detail: Text = Field(default="", max_length=2000)


def commands_router(controller: Controller, check: Callable[[Caller, str, str], None]) -> APIRouter:
    """``check(caller, node, field)`` is the app's own node-restriction check (403 for another node)."""
    repairs = RepairStore(controller.store)
    r = APIRouter()

    def known(node: str) -> None:
        if node not in controller.engine.nodes:
            raise NotFound("node", node)

    @r.get("/nodes/{node}/commands", response_model=CommandsOut,
           summary="Repair commands queued for the node (agent for its nodes)")
    def pending(node: str, caller: Reporter) -> CommandsOut:
        check(caller, node, "node")
        known(node)
        return CommandsOut(commands=[CommandOut(id=c.id, kind=c.kind, created=c.created, status=c.status)
                                     for c in repairs.pending(node)])

    @r.post("/nodes/{node}/commands/{command_id}/result", response_model=CommandOut,
            summary="The outcome of a repair command (agent for its nodes)")
    def result(node: str, command_id: str, body: CommandResultIn, caller: Reporter) -> CommandOut:
        check(caller, node, "node")
        known(node)
        c = repairs.finish(node, command_id, body.ok, body.detail, controller.clock.now())
        controller.audit(node, "command_result", f"{c.kind} ({c.id}) {c.status}: {body.detail}",
                         actor_id=f"agent:{caller.name}")
        return CommandOut(id=c.id, kind=c.kind, created=c.created, status=c.status)

    return r
