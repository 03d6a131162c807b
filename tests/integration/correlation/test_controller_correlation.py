"""Correlation inside the controller: one failing leaf switch becomes one decision, not 32 drains."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpufleet.controller.api.app import create_app
from gpufleet.controller.clock import ManualClock
from gpufleet.controller.service import Controller
from gpufleet.controller.settings import Role, TokenConfig
from gpufleet.controller.store.db import make_engine, migrate
from gpufleet.controller.store.repo import Page, Store
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.topology import Topology, to_fleet
from gpufleet.domain.topology_gen import generate_hgx
from gpufleet.lifecycle.config import parse_policy
from gpufleet.lifecycle.decisions import DecisionStatus
from gpufleet.lifecycle.states import NodeState

T0 = datetime(2026, 11, 21, 12, tzinfo=UTC)
TOKEN = "operator-token-0123456789"


def controller(tmp_path: Path, topo: Topology, budget: dict[str, float] | None = None) -> Controller:
    engine = make_engine(f"sqlite:///{tmp_path / 'g.db'}")
    migrate(engine)
    policy = parse_policy({"breaker": budget} if budget else {})
    c = Controller(Store(engine), policy, ManualClock(T0), topology=topo)
    c.register_fleet(to_fleet(topo), NodeState.READY)
    return c


def leaf_down(topo: Topology, leaf: str, nodes: list[str]) -> list[HealthEvent]:
    rail = leaf.rsplit("-r", 1)[1]
    return [HealthEvent(f"ld-{n}", n, EventKind.LINK_DOWN, T0 + timedelta(seconds=i), f"{n}-nic{rail}",
                        link=f"{n}-nic{rail}~{leaf}") for i, n in enumerate(nodes)]


@pytest.fixture(scope="module")
def hgx() -> Topology:
    return generate_hgx(64)  # 2 scalable units: each leaf serves 32 nodes


def su1_nodes(topo: Topology) -> list[str]:
    return sorted(topo.nodes_behind("leaf-su1-r3"))


def test_a_failed_leaf_is_one_held_decision_over_budget_and_one_approval(tmp_path: Path, hgx: Topology) -> None:
    c = controller(tmp_path, hgx)
    behind = su1_nodes(hgx)
    assert len(behind) == 32
    events = leaf_down(hgx, "leaf-su1-r3", behind[:5])
    for e in events:
        c.ingest([e])
    suspects = {s.component: s for s in c.verdicts}
    assert "leaf-su1-r3" in suspects and suspects["leaf-su1-r3"].kind == "leaf_switch"
    held = c.engine.held_group("correlate:leaf-su1-r3")
    # Every node behind the leaf, not only the five that reported, is in the one held group...
    assert set(held) | {n for n in behind if c.state_of(n) == NodeState.DRAINING} == set(behind)
    assert len(held) >= 29
    assert c.breaker.tripped
    held_lines = [a for a in c.store.audit(page=Page(limit=1000)) if a.action == "held"]
    assert sum("leaf_switch leaf-su1-r3 faulty" in a.detail for a in held_lines) == len(held)
    # ...and one operator approval carries the group out over the budget.
    app = create_app(c, (TokenConfig(name="ops", role=Role.OPERATOR, token=TOKEN),))
    http = TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"})
    r = http.post("/v1/held/approve", json={"component": "leaf-su1-r3"})
    assert r.status_code == 200, r.text
    assert all(c.state_of(n) == NodeState.DRAINING for n in behind)
    assert not c.engine.held_group("correlate:leaf-su1-r3")
    audit = http.get("/v1/audit", params={"limit": 1000}).json()
    assert any(a["action"] == "approve_held" and a["actor_id"] == "operator:ops" for a in audit)
    assert http.get("/v1/verdicts").json()["suspects"][0]["component"] == "leaf-su1-r3"


def test_within_budget_the_group_is_applied_at_once(tmp_path: Path, hgx: Topology) -> None:
    c = controller(tmp_path, hgx, {"max_unavailable_fleet": 0.6, "max_unavailable_domain": 1.0})
    behind = su1_nodes(hgx)
    for e in leaf_down(hgx, "leaf-su1-r3", behind[:4]):
        c.ingest([e])
    decisions = c.store.decisions(status=DecisionStatus.APPLIED.value, page=Page(limit=1000))
    grouped = [d for d in decisions if d.actor_id == "correlate:leaf-su1-r3"]
    assert {d.node for d in grouped} | {d.node for d in decisions if d.rule != "component_fault"} >= set(behind)
    assert all(c.state_of(n) == NodeState.DRAINING for n in behind)
    assert not c.breaker.tripped
    # Nodes in the other scalable unit are untouched.
    other = sorted(hgx.nodes_behind("leaf-su2-r3"))
    assert all(c.state_of(n) == NodeState.READY for n in other)


def test_scattered_single_node_faults_are_not_blamed_on_a_switch(tmp_path: Path, hgx: Topology) -> None:
    c = controller(tmp_path, hgx, {"max_unavailable_fleet": 1.0, "max_unavailable_domain": 1.0})
    behind = su1_nodes(hgx)
    # Two different rails on two nodes: two cables, no shared switch.
    c.ingest(leaf_down(hgx, "leaf-su1-r3", behind[:1]))
    c.ingest([HealthEvent("x", behind[5], EventKind.LINK_DOWN, T0, f"{behind[5]}-nic6",
                          link=f"{behind[5]}-nic6~leaf-su1-r6")])
    assert not any(s.kind == "leaf_switch" for s in c.verdicts)
    assert not any(d.actor_id.startswith("correlate:") for d in c.engine.held.values())
    # link events toward a switch wait for the correlator (correlation_hold); then each cable's node
    # gets its own decision, since no switch verdict covers them
    assert sum(c.state_of(n) in (NodeState.DRAINING, NodeState.SUSPECT) for n in behind) == 0
    assert isinstance(c.clock, ManualClock)
    c.clock.advance(c.policy_file.config.correlation_hold + timedelta(seconds=1))
    c.tick()
    assert sum(c.state_of(n) in (NodeState.DRAINING, NodeState.SUSPECT) for n in behind) == 2


def test_nodes_the_topology_does_not_name_are_warned_about_when_registered_and_at_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``--sim-nodes`` names r01-n001 where ``topology generate`` names r01-n01: correlation would see none
    of those nodes, silently, without this warning."""
    import logging

    from gpufleet.domain.fleet import Node

    topo = generate_hgx(4)
    caplog.set_level(logging.WARNING, logger="gpufleet.controller.service")
    c = controller(tmp_path, topo)  # the topology's own nodes: nothing to say
    assert not [r for r in caplog.records if "not in the topology" in r.getMessage()]
    c.register([Node("r01-n001", "r01"), Node("r01-n002", "r01"), Node(sorted(topo.nodes_behind("leaf-su1-r0"))[0]
                                                                        + "-x", "r01")])
    (warned,) = [r.getMessage() for r in caplog.records if "not in the topology" in r.getMessage()]
    assert warned.startswith("3 of the 3 nodes just registered") and "r01-n001, r01-n002" in warned
    caplog.clear()
    Controller(c.store, c.policy_file, ManualClock(T0), topology=topo)  # a restart: the same, over every node
    (warned,) = [r.getMessage() for r in caplog.records if "not in the topology" in r.getMessage()]
    assert warned.startswith(f"3 of the {len(to_fleet(topo).nodes) + 3} nodes registered")


def test_a_nodes_own_fault_superseded_by_a_held_group_is_held_again_after_a_restart(
        tmp_path: Path, hgx: Topology) -> None:
    """A drill on the Slurm lab: the leaf's held group took the place of n3's held XID 79; the operator
    found the switch fine and cancelled the group's decision for n3, which went back to ready with a GPU
    off the bus. The node's own decision is kept (status superseded, stored) and held again, across a
    controller restart too."""
    c = controller(tmp_path, hgx)
    behind = su1_nodes(hgx)
    # The breaker trips on fatal XIDs: most of them are held, each node's own decision.
    for i, n in enumerate(behind[:12]):
        c.ingest([HealthEvent(f"x79-{n}", n, EventKind.XID, T0 + timedelta(seconds=i), f"{n}-gpu0", 79)])
    x = next(n for n in behind[:12] if n in c.engine.held)
    own = c.engine.held[x].id
    for e in leaf_down(hgx, "leaf-su1-r3", behind[12:17]):
        c.ingest([e.__class__(e.id, e.node, e.kind, e.time + timedelta(seconds=30), e.component, link=e.link)])
    assert c.engine.held[x].actor_id == "correlate:leaf-su1-r3", "the group's decision took the place of x's"
    assert [d.status for d in c.store.decisions(node=x, page=Page(limit=100)) if d.id == own] == \
        [DecisionStatus.SUPERSEDED.value]
    again = Controller(c.store, c.policy_file, ManualClock(T0 + timedelta(minutes=5)), topology=hgx)  # a restart
    again.cancel_held(x, "operator:carol", "leaf-su1-r3 checked: the switch is fine")
    assert again.engine.held[x].id == own and again.state_of(x) is NodeState.SUSPECT
    assert [d.status for d in again.store.decisions(node=x, page=Page(limit=100)) if d.id == own] == \
        [DecisionStatus.HELD.value]
    detail = [a.detail for a in again.store.audit(page=Page(limit=1000)) if a.action == "cancel_held"]
    assert detail and own in detail[-1] and "held again" in detail[-1]


def test_the_verdicts_endpoint_lists_the_watch_list_to_operators_not_to_tenants(tmp_path: Path) -> None:
    """Three trays each with one corrected NVLink error towards one chip: no verdict, but the chip is on
    the watch list of GET /v1/verdicts (``watch``: how many decades of significance; 0 turns it off)."""
    from gpufleet.domain.topology_gen import generate_nvl72

    rack = generate_nvl72(1)
    c = controller(tmp_path, rack)
    trays = sorted(n for n in rack.components if rack.components[n].kind.value == "compute_tray")[:3]
    for i, t in enumerate(trays):
        gpu = f"{t}-gpu{i}"
        link = [lid for lid in rack.links_of(gpu) if rack.links[lid].kind == "nvlink"][5]
        c.ingest([HealthEvent(f"le-{i}", t, EventKind.LINK_ERROR, T0 + timedelta(seconds=20 * i), gpu, link=link)])
    chip = rack.links[link].other(gpu)
    tokens = (TokenConfig(name="ops", role=Role.OPERATOR, token=TOKEN),
              TokenConfig(name="t1", role=Role.VIEWER, token="tenant-token-0123456789", tenant="t1"))
    http = TestClient(create_app(c, tokens), headers={"Authorization": f"Bearer {TOKEN}"})
    doc = http.get("/v1/verdicts").json()
    assert doc["suspects"] == []
    (w,) = [w for w in doc["watching"] if w["component"] == chip]
    assert (w["kind"], w["witnesses"], sorted(w["reporters"])) == ("nvswitch", 3, [f"{t}-gpu{i}" for i, t in
                                                                                     enumerate(trays)])
    assert 0 < w["decades_short"] <= 2
    assert http.get("/v1/verdicts", params={"watch": 0}).json()["watching"] == []
    bad = http.get("/v1/verdicts", params={"watch": 7})
    assert bad.status_code == 422 and "watch" in bad.text, bad.text
    tenant = http.get("/v1/verdicts", headers={"Authorization": "Bearer tenant-token-0123456789"})
    assert tenant.status_code == 200 and tenant.json()["watching"] == [], tenant.text
