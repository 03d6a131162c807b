"""The blast-radius breaker through the API: a bad health check flags every node at once; automation
drains at most the budget (10 % of the fleet, 25 % of a rack), holds the rest and trips the breaker."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.api.conftest import Api, make_api

NODES, RACKS = 100, 4  # 25 nodes a rack: fleet budget 10, rack budget 6
FLEET_CAP, RACK_CAP = 10, 6


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Api]:
    a = make_api(tmp_path, nodes=NODES, racks=RACKS)
    yield a
    a.client.close()
    a.engine.dispose()


def _out(api: Api) -> list[str]:
    """Nodes automation took out (or committed to take out)."""
    return sorted(n for n, s in api.states().items() if s in ("draining", "drained", "repair", "revalidate"))


def _burst(api: Api, order: list[str]) -> None:
    """Each node's agent reports the (bad) check's failure, one report per node, in ``order``."""
    for i, node in enumerate(order):
        ev = api.event(f"chk-{api.clock.now():%H%M%S}-{i}", node, "check_failed", None,
                       component=f"{node}-gpu0", message="gemm: 0.0 TFLOPS")
        r = api.post("/v1/events", {"events": [ev]}, "agent")
        assert r.status_code == 202, r.text


def _check_budget(api: Api) -> list[str]:
    out = _out(api)
    assert len(out) <= FLEET_CAP
    assert max(Counter(n.split("-")[0] for n in out).values()) <= RACK_CAP
    drains = [a for a in api.get("/v1/actions", limit=1000) if a["kind"] == "drain" and a["status"] == "pending"]
    assert sorted(a["node"] for a in drains) == out
    return out


@pytest.mark.parametrize(("order", "budget", "drained"), [
    ("rack by rack", "domain budget: 7 of 25 nodes in rack:r01", RACK_CAP),
    ("across racks", "fleet budget: 11 of 100 nodes", FLEET_CAP),
])
def test_a_burst_flagging_every_node_drains_at_most_the_budget(fleet: Api, order: str, budget: str,
                                                                drained: int) -> None:
    nodes = fleet.nodes if order == "rack by rack" else sorted(fleet.nodes, key=lambda n: (n[4:], n[:3]))
    fleet.tick()
    _burst(fleet, nodes)

    out = _check_budget(fleet)
    assert len(out) == drained
    breaker = fleet.get("/v1/breaker")
    assert breaker["tripped"] is True
    assert budget in breaker["reason"]
    assert breaker["held"] == NODES - drained
    held = [d for d in fleet.get("/v1/decisions", limit=1000) if d["status"] == "held"]
    assert len(held) == NODES - drained
    assert Counter(fleet.states().values()) == {"draining": drained, "suspect": NODES - drained}
    trips = [a for a in fleet.get("/v1/audit", limit=1000) if a["action"] == "breaker_trip"]
    assert len(trips) == 1
    assert budget in trips[0]["detail"]
    assert fleet.get("/v1/status")["breaker"]["tripped"] is True


def test_reset_re_admits_held_decisions_within_the_budget(fleet: Api) -> None:
    order = sorted(fleet.nodes, key=lambda n: (n[4:], n[:3]))
    fleet.tick()
    _burst(fleet, order)
    first = _out(fleet)
    assert len(first) == FLEET_CAP

    # The first wave is drained, repaired and revalidated, so the budget is free again.
    for _ in range(2):
        fleet.tick()
        fleet.reconciler.run_once()
    assert set(first) <= {n for n, s in fleet.states().items() if s == "repair"}
    for node in first:
        assert fleet.post(f"/v1/nodes/{node}/repair-complete", {}, "operator").status_code == 200
    fleet.tick()
    passed = [fleet.event(f"ok-{n}", n, "check_passed", None) for n in first]
    assert fleet.post("/v1/events", {"events": passed}, "agent").json()["decisions"] == FLEET_CAP
    fleet.tick()
    fleet.reconciler.run_once()
    assert _out(fleet) == []
    assert fleet.get("/v1/breaker")["tripped"] is True  # nothing resets it but an operator

    r = fleet.post("/v1/breaker/reset", {"discard_held": False}, "operator")
    assert r.status_code == 200
    second = _check_budget(fleet)
    assert len(second) == FLEET_CAP
    assert not set(second) & set(first)  # the held decisions, oldest first, not the repaired nodes
    after = r.json()
    assert after["tripped"] is True  # the 11th re-admitted decision is over budget again
    assert after["held"] == NODES - 2 * FLEET_CAP
    resets = [a for a in fleet.get("/v1/audit", limit=1000) if a["action"] == "breaker_reset"]
    assert len(resets) == 1
    assert resets[0]["actor_id"] == "operator:alice"


def test_reset_discarding_held_decisions_returns_the_suspects(fleet: Api) -> None:
    fleet.tick()
    _burst(fleet, fleet.nodes)
    r = fleet.post("/v1/breaker/reset", {"discard_held": True}, "operator")
    assert r.json() == {"tripped": False, "reason": "", "since": None, "held": 0, "out_in_scheduler": []}
    assert Counter(fleet.states().values()) == {"draining": RACK_CAP, "ready": NODES - RACK_CAP}
    assert {d["status"] for d in fleet.get("/v1/decisions", limit=1000)} == {"applied", "cancelled"}
