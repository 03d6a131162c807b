"""Listings that grow with the fleet answer a page, not the whole fleet (a fleet has 20,000 nodes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from gpufleet.controller.api.app import create_app
from gpufleet.controller.bmc.redfish import Firmware, FirmwareItem
from gpufleet.controller.bmc.watcher import BmcWatcher, FirmwareRecord
from tests.integration.api.conftest import TOKENS, auth, make_api


def test_firmware_is_listed_a_page_at_a_time_with_the_fleets_total_and_drift(tmp_path: Path) -> None:
    api = make_api(tmp_path)
    watcher = BmcWatcher(api.controller, {})
    nodes = [f"r{i // 100:02d}-n{i % 100:02d}" for i in range(250)]  # more than a page
    for i, n in enumerate(nodes):
        bios = "1.6.0" if i == 240 else "1.5.0"  # one node drifts, on the last page
        fw = Firmware("2.10.4", bios, (FirmwareItem("g", "GPU", "96"),))
        watcher.firmware[n] = FirmwareRecord(n, api.clock.now(), fw)
    app = create_app(api.controller, tuple(TOKENS.values()), api.reconciler, bmc=watcher)
    with TestClient(app) as client:
        def get(who: str = "viewer", **params: object) -> dict[str, Any]:
            r = client.get("/v1/firmware", headers=auth(who), params=params)
            assert r.status_code == 200, r.text
            return r.json()

        first = get()
        assert [x["node"] for x in first["nodes"]] == nodes[:100] and first["total"] == 250
        last = get(limit=100, offset=200)
        assert [x["node"] for x in last["nodes"]] == nodes[200:]
        drift = [x["node"] for x in last["nodes"] if any(c["drift"] for c in x["components"])]
        assert drift == [nodes[240]]  # against the fleet's common version, not the page's
        assert [x["node"] for x in get(limit=1000)["nodes"]] == nodes
        acme = get("acme-viewer", limit=10, offset=95)  # a tenant: a page of its own nodes (rack r01)
        assert [x["node"] for x in acme["nodes"]] == nodes[195:200] and acme["total"] == 100
        assert client.get("/v1/firmware", headers=auth("viewer"), params={"limit": 1001}).status_code == 422
    api.client.close()
    api.engine.dispose()
