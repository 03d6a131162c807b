"""``GET /v1/ttm``: time to market, per node and for the cluster (viewer; docs/lifecycle.md#time-to-market).

Query: ``share`` (repeatable percentages, default 50, 90, 99, 100) and ``nodes`` (include the per-node
rows; default true). Computed by :mod:`gpufleet.lifecycle.ttm` from the store's node registrations
and transitions.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel

from gpufleet.controller.service import Controller
from gpufleet.lifecycle.ttm import DEFAULT_SHARES, cluster_ttm

from .auth import READ, Caller, require
from .scope import Scope

Reader = Annotated[Caller, Depends(require(READ))]


class NodeTtmOut(BaseModel):
    node: str
    registered: datetime
    first_ready: datetime | None
    ttm_s: float | None  # registered -> first ready
    burned_in: bool
    failures_found: int
    state: str


class ShareOut(BaseModel):
    share: float  # percent of the registered nodes
    after_s: float | None  # seconds from the first registration until that share was first ready


class TtmOut(BaseModel):
    nodes: int
    ready: int
    not_ready: list[str]
    started: datetime | None
    until: list[ShareOut]
    burned_in: int
    failures_found: int
    median_burn_in_s: float | None
    per_node: list[NodeTtmOut] | None


def ttm_router(controller: Controller, scope: Scope) -> APIRouter:
    r = APIRouter()

    @r.get("/ttm", response_model=TtmOut, summary="Time to market: registration to first ready (viewer)")
    def ttm(caller: Reader,
            share: Annotated[list[float] | None, Query(description="percent of nodes; repeatable")] = None,
            nodes: bool = True) -> dict[str, Any]:
        scope.fleet(caller, "time to market")
        return cluster_ttm(controller.store.histories(), tuple(share) if share else DEFAULT_SHARES).as_dict(
            per_node=nodes)

    return r
