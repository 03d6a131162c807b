"""Hot-spare pools (docs/spares.md): ``GET /v1/spares`` (viewer) — per pool, its config, the spares
ready, lent and being reclaimed or reclaimed per topology domain, the failed nodes no spare replaces
yet (and why), each node the pool holds (role, reclaim step, since) and the last pass. ``[]`` while no
pool is configured."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from gpufleet.controller.spares import Spares

from .auth import READ, Caller, require
from .scope import Scope

Reader = Annotated[Caller, Depends(require(READ))]


def spares_router(spares: Spares | None, scope: Scope) -> APIRouter:
    r = APIRouter()

    @r.get("/spares", summary="Hot-spare pools: spares ready, lent, reclaimed per domain (viewer)")
    def status(caller: Reader) -> list[dict[str, Any]]:
        scope.fleet(caller, "the hot-spare pools")  # fleet-wide: not for a tenant-scoped token
        return spares.status() if spares is not None else []

    return r
