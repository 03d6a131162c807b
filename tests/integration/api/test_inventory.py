"""PUT/GET /v1/nodes/{node}/inventory: stored, validated, and a serial at a new slot becomes a ``moved`` event."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpufleet.controller.api.app import create_app
from gpufleet.controller.clock import ManualClock
from gpufleet.controller.service import Controller
from gpufleet.controller.store.db import make_engine, migrate
from gpufleet.controller.store.repo import Store
from gpufleet.correlate.model import Basis
from gpufleet.domain.fleet import ComponentKind as K
from gpufleet.domain.topology import Topology, to_fleet
from gpufleet.domain.topology_gen import generate_nvl72
from gpufleet.lifecycle.config import load_policy
from gpufleet.lifecycle.states import NodeState
from tests.integration.api.conftest import T0, TOKENS, Api, auth

DOC: dict[str, Any] = {
    "format": "gpufleet.inventory/v1", "node": "r01-n01", "serial": "NODE-00017",
    "gpus": [{"index": 0, "uuid": "GPU-5d1e", "serial": "1654922006281", "pci": "0000:18:00.0",
              "sku": "NVIDIA H100 80GB HBM3", "nvlinks": 2, "nvlink_peers": ["0000:05:00.0", ""]}],
    "nics": [{"device": "mlx5_0", "netdev": "ibp24s0", "pci": "0000:18:00.1", "serial": "MT2231X00001",
              "ports": [{"port": 1, "guid": "0x9c63c00300abcd01", "link_layer": "InfiniBand"}]}],
}


def put(client: TestClient, node: str, body: Any, who: str = "agent") -> Any:
    return client.put(f"/v1/nodes/{node}/inventory", json=body, headers=auth(who))


def test_an_agent_registers_its_inventory_and_a_viewer_reads_it_back(api: Api) -> None:
    assert api.client.get("/v1/nodes/r01-n01/inventory", headers=auth("viewer")).status_code == 404
    r = put(api.client, "r01-n01", DOC)
    assert r.status_code == 200, r.text
    assert r.json() == {"moved": [], "missing": []}  # first sight of every serial: nothing moved
    assert api.get("/v1/nodes/r01-n01/inventory") == DOC
    again = put(api.client, "r01-n01", {**DOC, "serial": "NODE-00099"}, who="agent-r01")
    assert again.status_code == 200 and api.get("/v1/nodes/r01-n01/inventory")["serial"] == "NODE-00099"


@pytest.mark.parametrize(("body", "field"), [
    ({**DOC, "gpus": [{"serial": "1654922006281"}]}, "inventory.gpus[0].index"),
    ({**DOC, "nics": [{"device": "mlx5_0", "ports": [{"port": -1}]}]}, "inventory.nics[0].ports[0].port"),
    ({**DOC, "format": "gpufleet.inventory/v9"}, "inventory.format"),
    ({**DOC, "gpu": []}, "inventory.gpu"),
    ({**DOC, "node": "r01-n02"}, "inventory.node"),  # not the node of the path
    ([DOC], "body"),
])
def test_a_bad_inventory_is_a_422_naming_the_field(api: Api, body: Any, field: str) -> None:
    r = put(api.client, "r01-n01", body)
    assert r.status_code == 422, r.text
    assert [d["field"] for d in r.json()["detail"]] == [field]
    assert api.client.get("/v1/nodes/r01-n01/inventory", headers=auth("viewer")).status_code == 404


def test_unknown_node_is_404_and_another_nodes_token_is_403(api: Api) -> None:
    r = put(api.client, "r09-n99", {**DOC, "node": "r09-n99"})
    assert r.status_code == 404 and "r09-n99" in r.json()["detail"]
    assert api.client.get("/v1/nodes/r09-n99/inventory", headers=auth("viewer")).status_code == 404
    r = put(api.client, "r02-n01", {**DOC, "node": "r02-n01"}, who="agent-r01")  # its token covers r01-* only
    assert r.status_code == 403
    assert put(api.client, "r01-n01", DOC, who="viewer").status_code == 403


# -- with a topology: a tray swap seen in the reported serials --------------------------------------


@pytest.fixture
def nvl(tmp_path: Path) -> Iterator[tuple[TestClient, Controller, ManualClock, Topology]]:
    engine = make_engine(f"sqlite:///{tmp_path / 'api.db'}")
    migrate(engine)
    topo = generate_nvl72(2)
    clock = ManualClock(T0)
    controller = Controller(Store(engine), load_policy(), clock, topology=topo)
    controller.register_fleet(to_fleet(topo), NodeState.READY)
    client = TestClient(create_app(controller, tuple(TOKENS.values())))
    yield client, controller, clock, topo
    client.close()
    engine.dispose()


def _report(topo: Topology, units_of: str, node: str) -> dict[str, Any]:
    """The inventory the agent at ``node`` reports when the tray of slot ``units_of`` sits there."""
    c = topo.components
    return {"node": node, "serial": c[units_of].serial,
            "gpus": [{"index": i, "serial": c[g].serial} for i, g in enumerate(topo.children_of_kind(units_of, K.GPU))],
            "nics": [{"device": f"mlx5_{k}", "serial": c[n].serial}
                     for k, n in enumerate(topo.children_of_kind(units_of, K.NIC))]}


def _storm(client: TestClient, clock: ManualClock, tray: str, tag: str) -> None:
    """NVLink errors on every GPU of ``tray`` towards three NVSwitch chips of its rack: a bad tray."""
    rack = tray.split("-", maxsplit=1)[0]
    events = []
    for g in range(4):
        for chip in ("sw2-nvsw0", "sw6-nvsw1", "sw7-nvsw0"):
            now = clock.advance(timedelta(seconds=2))
            events.append({"id": f"{tag}-{g}-{chip}", "node": tray, "kind": "xid", "code": 149,
                           "time": now.isoformat(), "component": f"{tray}-gpu{g}",
                           "link": f"{tray}-gpu{g}~{rack}-{chip}"})
    r = client.post("/v1/events", json={"events": events}, headers=auth("agent"))
    assert r.status_code == 202 and r.json()["accepted"] == len(events), r.text


def test_a_tray_swap_in_the_reported_serials_moves_the_fault_with_the_tray(
    nvl: tuple[TestClient, Controller, ManualClock, Topology],
) -> None:
    client, controller, clock, topo = nvl
    a, b = "r01-ct03", "r02-ct07"
    tray_a, tray_b = topo.components[a].serial, topo.components[b].serial
    _storm(client, clock, a, "before")
    clock.advance(timedelta(minutes=10))
    r1 = put(client, b, _report(topo, a, b))  # tray a now answers at slot b ...
    clock.advance(timedelta(seconds=30))
    r2 = put(client, a, _report(topo, b, a))  # ... and tray b at slot a
    assert r1.status_code == 200 and r2.status_code == 200, (r1.text, r2.text)
    moved = r1.json()["moved"] + r2.json()["moved"]
    assert [(m["node"], m["kind"], m["source"], m["attrs"]) for m in moved] == [
        (b, "moved", "controller", {"serial": tray_a, "from": a, "to": b}),
        (a, "moved", "controller", {"serial": tray_b, "from": b, "to": a}),
    ]  # one move per tray: its GPUs and NICs went with it
    stored = client.get("/v1/events", params={"kind": "moved"}, headers=auth("viewer")).json()
    assert sorted(e["id"] for e in stored) == sorted(m["id"] for m in moved)
    assert put(client, b, _report(topo, a, b)).json() == {"moved": [], "missing": []}  # a repeat is no news

    clock.advance(timedelta(minutes=5))
    _storm(client, clock, b, "after")  # the same fault, now at the new slot
    suspects = client.get("/v1/verdicts", headers=auth("viewer")).json()["suspects"]
    assert (suspects[0]["component"], suspects[0]["serial"]) == (b, tray_a)
    (standing,) = [s for s in controller.verdicts if s.component == b]
    assert standing.finding is Basis.FOLLOWS_SERIAL


def test_a_node_reports_its_own_parts_and_links_never_another_nodes(
    nvl: tuple[TestClient, Controller, ManualClock, Topology],
) -> None:
    """api.md §Security: a node must not report another node's faults. An event of node r01-ct01 naming a
    GPU of r01-ct02, or that GPU's NVLink, is a 422 naming the field; nothing of the batch is stored; the
    node's own part and link are accepted (an operations drill had another node's NICs accepted)."""
    client, _, clock, topo = nvl
    node, other = "r01-ct01", "r01-ct02"
    mine = topo.children_of_kind(node, K.GPU)[0]
    theirs = topo.children_of_kind(other, K.GPU)[0]
    my_link = next(i for i, ln in topo.links.items() if mine in (ln.a, ln.b))
    their_link = next(i for i, ln in topo.links.items() if theirs in (ln.a, ln.b))
    now = clock.advance(timedelta(seconds=1)).isoformat()

    def post(*events: dict[str, Any]) -> Any:
        return client.post("/v1/events", json={"events": list(events)}, headers=auth("agent"))

    ok = {"id": "own", "node": node, "kind": "xid", "code": 149, "time": now, "component": mine, "link": my_link}
    for bad, field, value in (
        ({"id": "x1", "node": node, "kind": "xid", "code": 79, "time": now, "component": theirs}, "component", theirs),
        ({"id": "x2", "node": node, "kind": "link_error", "time": now, "component": mine, "link": their_link},
         "link", their_link),
    ):
        r = post(ok, bad)
        assert r.status_code == 422, r.text
        (detail,) = r.json()["detail"]
        assert (detail["field"], detail["value"]) == (f"events[1].{field}", value) and node in detail["expected"]
        assert client.get("/v1/events", params={"node": node}, headers=auth("viewer")).json() == []
    r = post(ok)
    assert r.status_code == 202 and r.json()["accepted"] == 1, r.text
