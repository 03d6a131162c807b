"""Heartbeat loss: the reconciler turns an agent's silence into one heartbeat_lost event per silence."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy.exc import OperationalError

from tests.integration.api.conftest import Api


def _beat(api: Api, node: str) -> None:
    r = api.post(f"/v1/nodes/{node}/heartbeat", {"time": api.clock.now().isoformat()}, "agent")
    assert r.status_code == 200, r.text


def _lost(api: Api) -> list[str]:
    return sorted(e["node"] for e in api.get("/v1/events", kind="heartbeat_lost", limit=1000))


def test_silent_nodes_are_reported_once_per_silence(api: Api) -> None:
    for node in ("r01-n01", "r01-n02", "r02-n01", "r02-n02"):
        _beat(api, node)
    api.post("/v1/nodes/r02-n02/retire", {}, "operator")  # retired nodes are not expected to report
    api.tick(timedelta(seconds=90))
    _beat(api, "r01-n02")  # still talking
    api.tick(timedelta(seconds=60))  # 150 s since the first beats; the timeout is 120 s
    api.reconciler.run_once()
    assert _lost(api) == ["r01-n01", "r02-n01"]  # r01-n02 beat 60 s ago; the others never beat

    api.tick(timedelta(seconds=30))
    api.reconciler.run_once()
    assert _lost(api) == ["r01-n01", "r02-n01"]  # the same silence is not reported twice

    _beat(api, "r02-n01")
    api.tick(timedelta(seconds=121))
    api.reconciler.run_once()
    assert _lost(api) == ["r01-n01", "r01-n02", "r02-n01", "r02-n01"]  # a new silence after a new beat
    (first,) = [e for e in api.get("/v1/events", node="r01-n01") if e["kind"] == "heartbeat_lost"]
    assert first["source"] == "controller"
    assert "no heartbeat since" in first["message"]


def test_liveness_is_the_controllers_receive_time_not_the_agents_clock(api: Api) -> None:
    # Issue #16: a beat stamped an hour ago sent a live node to suspect within seconds; one stamped
    # 2099 made a node never look silent.
    behind = (api.clock.now() - timedelta(hours=1)).isoformat()
    r = api.post("/v1/nodes/r01-n01/heartbeat", {"time": behind}, "agent")
    assert r.status_code == 200
    assert api.post("/v1/nodes/r01-n02/heartbeat", {"time": "2099-01-01T00:00:00Z"}, "agent").status_code == 200
    api.tick(timedelta(seconds=30))
    api.reconciler.run_once()
    assert _lost(api) == []  # the node an hour behind beat 30 s ago: alive
    api.tick(timedelta(seconds=121))
    api.reconciler.run_once()
    assert _lost(api) == ["r01-n01", "r01-n02"]  # both silent now, whatever their clocks said
    assert api.controller.clock_skew["r01-n01"] == -3600.0
    assert api.controller.clock_skew["r01-n02"] > 365 * 86400


def _held(api: Api) -> dict[str, dict[str, object]]:
    return {d["node"]: d for d in api.get("/v1/decisions", status="held", limit=1000)}


def _two_fall_silent(api: Api) -> list[str]:
    """Every agent beats, then two fall silent past the heartbeat timeout and the reconciler notices:
    one node is drained within the budget, the other's decision is held. Returns the two."""
    for node in api.nodes:
        _beat(api, node)
    api.tick(timedelta(seconds=90))
    quiet = ["r01-n01", "r02-n01"]
    for node in api.nodes:
        if node not in quiet:
            _beat(api, node)
    api.tick(timedelta(seconds=60))
    api.reconciler.run_once()
    return quiet


def test_a_held_decision_about_silence_is_cancelled_when_the_agent_is_heard_again(api: Api) -> None:
    """The drill: two agents fell silent; one node was drained, the other's decision held by the breaker.
    The agent came back, yet its held decision stayed, and a later approve drained a healthy node."""
    quiet = _two_fall_silent(api)
    assert _lost(api) == quiet
    other = "r02-n02"  # held for a different reason: a failed check
    ev = api.event("chk-1", other, "check_failed", None, component=f"{other}-gpu0", message="gemm: 0.0 TFLOPS")
    assert api.post("/v1/events", {"events": [ev]}, "agent").status_code == 202
    held = _held(api)
    (silent,) = [n for n in quiet if n in held]  # one silent node drained within the budget, the other held
    assert other in held and api.states()[silent] == "suspect"

    _beat(api, silent)
    _beat(api, other)
    after = _held(api)
    assert silent not in after and after.get(other) == held[other], "only the decision about silence goes"
    assert api.states()[silent] == "ready"
    (line,) = [a for a in api.get("/v1/audit", target=silent, limit=1000) if a["action"] == "cancel_held"]
    assert line["actor"] == "system" and "heard again" in line["detail"] and str(held[silent]["id"]) in line["detail"]
    r = api.post("/v1/held/approve", {"nodes": [silent]}, "operator")
    assert r.status_code == 404, r.text  # nothing left to approve: a later approve cannot drain it
    assert api.states()[silent] == "ready"


def test_a_failed_read_of_the_held_decision_does_not_fail_the_recorded_heartbeat(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """A review's case: the held decision's evidence is read after the heartbeats are stored; a database
    error there answered 503 for heartbeats already recorded. It is logged and tried at the next one."""
    quiet = _two_fall_silent(api)
    (silent,) = [n for n in quiet if n in _held(api)]
    store = api.controller.store
    real = store.event_kinds

    def broken(node: str, ids: object) -> set[str]:
        raise OperationalError("SELECT ...", {}, Exception("connection refused"))

    monkeypatch.setattr(store, "event_kinds", broken)
    _beat(api, silent)  # answered 2xx (it asserts): the heartbeat is recorded
    assert silent in _held(api)  # not cancelled yet: the read failed
    monkeypatch.setattr(store, "event_kinds", real)
    _beat(api, silent)
    assert silent not in _held(api)  # the next heartbeat does it
