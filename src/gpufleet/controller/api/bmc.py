"""Out-of-band routes: firmware inventory and diagnostic bundles (docs/bmc.md, docs/api.md).

* ``GET /v1/firmware`` (viewer) — every node's BMC, BIOS and component firmware versions as last read
  from its BMC, each marked ``drift`` when it differs from the fleet's most common version.
* ``PUT /v1/nodes/{node}/commands/{id}/bundle`` (agent for that node) — the agent's part of a
  diagnostic bundle; the controller completes and stores it (201; the same again: 200, unchanged).
* ``GET /v1/nodes/{node}/bundles`` (viewer) — the node's bundles, newest first.
* ``GET /v1/bundles/{id}`` (viewer) — one bundle, ``application/gzip`` (a gzipped JSON document,
  ``gpufleet.bundle/v1``), with its SHA-256 in ``X-Content-SHA256``.

Nothing here returns a BMC address or credential.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel

from gpufleet.controller.bmc.watcher import BmcWatcher
from gpufleet.controller.bundles import Bundles
from gpufleet.controller.service import Controller
from gpufleet.controller.store.bundles import MAX_BUNDLE_BYTES, BundleInfo
from gpufleet.domain.errors import InvalidInput, NotFound

from .auth import READ, REPORT, Caller, require
from .schemas import Limit, Offset
from .scope import Scope

Reader = Annotated[Caller, Depends(require(READ))]
Reporter = Annotated[Caller, Depends(require(REPORT))]


class BundleOut(BaseModel):
    id: str
    node: str
    action_id: str
    created: datetime
    size: int
    sha256: str
    summary: str
    url: str


class BundlesOut(BaseModel):
    bundles: list[BundleOut]


def _out(b: BundleInfo) -> BundleOut:
    return BundleOut(id=b.id, node=b.node, action_id=b.action_id, created=b.created, size=b.size,
                     sha256=b.sha256, summary=b.summary, url=f"/v1/bundles/{b.id}")


def bmc_router(controller: Controller, check: Callable[[Caller, str, str], None], watcher: BmcWatcher | None,
               bundles: Bundles | None, scope: Scope) -> APIRouter:
    r = APIRouter()
    store = bundles or Bundles(controller)

    @r.get("/firmware", summary="Firmware versions read from each node's BMC, with drift (viewer)")
    def firmware(caller: Reader, limit: Limit = 100, offset: Offset = 0) -> dict[str, Any]:
        """A page of the nodes, by node name (a fleet has 20,000); ``total``: how many there are. Drift
        is against the whole fleet's most common versions, whatever the page."""
        nodes = [n for n in (watcher.inventory() if watcher is not None else [])
                 if scope.sees(caller, str(n.get("node", "")))]
        return {"nodes": nodes[offset:offset + limit], "total": len(nodes),
                "bmc": "configured" if watcher is not None else "none ([repair] bmc_file)"}

    @r.put("/nodes/{node}/commands/{command_id}/bundle", status_code=201, response_model=BundleOut,
           summary="Upload the agent's part of a diagnostic bundle (agent for its nodes)")
    async def upload(node: str, command_id: str, request: Request, caller: Reporter, response: Response) -> BundleOut:
        check(caller, node, "node")
        if node not in controller.engine.nodes:
            raise NotFound("node", node)
        raw = await request.body()
        if len(raw) > 4 * MAX_BUNDLE_BYTES:
            raise InvalidInput("bundle", f"{len(raw)} bytes", f"at most {4 * MAX_BUNDLE_BYTES} bytes of JSON")
        try:
            doc = json.loads(raw)
        except ValueError:
            raise InvalidInput("bundle", "(body)", "a JSON object") from None
        if not isinstance(doc, dict):
            raise InvalidInput("bundle", type(doc).__name__, "a JSON object")
        existed = store.store.info(command_id) is not None
        info = store.accept(node, command_id, doc)
        if existed:
            response.status_code = 200
        return _out(info)

    @r.get("/nodes/{node}/bundles", response_model=BundlesOut, summary="The node's diagnostic bundles (viewer)")
    def of_node(node: str, caller: Reader) -> BundlesOut:
        scope.node(caller, node)
        controller.state_of(node)  # NotFound (404) for a node the controller does not know
        return BundlesOut(bundles=[_out(b) for b in store.store.of_node(node)])

    @r.get("/bundles/{bundle_id}", summary="Download a diagnostic bundle: gzipped JSON (viewer)",
           response_class=Response, responses={200: {"content": {"application/gzip": {}}}})
    def download(bundle_id: str, caller: Reader) -> Response:
        info = store.store.info(bundle_id)
        if info is None or not scope.sees(caller, info.node):
            raise NotFound("bundle", bundle_id)
        name = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in bundle_id)
        return Response(store.store.data(bundle_id), media_type="application/gzip",
                        headers={"Content-Disposition": f'attachment; filename="{name}.json.gz"',
                                 "X-Content-SHA256": info.sha256})

    return r
