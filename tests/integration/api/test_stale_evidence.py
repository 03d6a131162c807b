"""Faults that arrive stamped before their node's last transition are not acted on — and say so: an
audit line per node and batch, a counter on /metrics (they used to vanish without a trace)."""

from __future__ import annotations

from datetime import timedelta

from tests.integration.api.conftest import Api, auth


def _audit(api: Api, node: str) -> list[dict[str, object]]:
    return [a for a in api.get("/v1/audit", target=node) if a["action"] == "stale_evidence"]


def _stale_total(api: Api) -> float:
    text = api.client.get("/metrics", headers=auth("viewer")).text
    line = next(ln for ln in text.splitlines() if ln.startswith("gpufleet_stale_events_total "))
    return float(line.split()[1])


def test_late_faults_are_audited_and_counted_not_acted_on(api: Api) -> None:
    old = (api.clock.now() - timedelta(hours=2)).isoformat()  # before the node was registered ready
    batch = [api.event("old-79", "r01-n01", time=old), api.event("old-94", "r01-n01", code=94, time=old),
             api.event("old-13", "r01-n01", code=13, time=old)]  # XID 13 is info: nothing to say about it
    r = api.post("/v1/events", {"events": batch}, "agent")
    assert r.status_code == 202, r.text
    assert api.states()["r01-n01"] == "ready"  # not acted on
    (line,) = _audit(api, "r01-n01")
    assert str(line["detail"]).startswith("2 degraded/fatal event(s) not acted on")
    assert "old-79" in str(line["detail"]) and "ready since" in str(line["detail"])
    assert _stale_total(api) == 2
    # a fault stamped now is acted on, and is not called stale
    r = api.post("/v1/events", {"events": [api.event("new-79", "r01-n02")]}, "agent")
    assert r.status_code == 202, r.text
    assert api.states()["r01-n02"] in ("draining", "drained")
    assert _audit(api, "r01-n02") == [] and _stale_total(api) == 2


def test_a_fault_from_a_node_whose_clock_is_behind_is_judged_on_the_controllers_clock(api: Api) -> None:
    # Issue #16: the node's agent clock is an hour behind (measured at its heartbeat). Its fresh XID 79 is
    # stamped an hour "ago", before the node was registered ready; judged by the agent's stamp it was stale
    # and the node stayed in service with a fatal fault. On the controller's clock it is new: drain.
    behind = timedelta(hours=1)
    for node in ("r01-n01", "r01-n02"):
        beat = api.post(f"/v1/nodes/{node}/heartbeat", {"time": (api.clock.now() - behind).isoformat()}, "agent")
        assert beat.status_code == 200, beat.text
    api.tick(timedelta(minutes=10))
    r = api.post("/v1/events", {"events": [api.event("skewed-79", "r01-n01",
                                                     time=(api.clock.now() - behind).isoformat())]}, "agent")
    assert r.status_code == 202, r.text
    assert api.states()["r01-n01"] in ("draining", "drained")
    assert _audit(api, "r01-n01") == []
    # what the agent reported is what the store keeps
    (stored,) = [e for e in api.get("/v1/events", node="r01-n01") if e["id"] == "skewed-79"]
    assert stored["time"].startswith((api.clock.now() - behind).isoformat()[:19])
    # a fault that really is old stays old on either clock: stamped two hours before the agent's now
    # (three before ours), it predates the node's last transition
    old = (api.clock.now() - behind - timedelta(hours=2)).isoformat()
    r = api.post("/v1/events", {"events": [api.event("spooled-79", "r01-n02", time=old)]}, "agent")
    assert r.status_code == 202, r.text
    assert api.states()["r01-n02"] == "ready"
    assert len(_audit(api, "r01-n02")) == 1
