"""Operator actions are audited with the caller's identity; dry-run decides and records, and acts on nothing."""

from __future__ import annotations

from typing import Any

from tests.integration.api.conftest import Api, auth


def _ok(r: Any) -> Any:
    assert r.status_code in (200, 201, 202), r.text
    return r.json()


def _audit_of(api: Api, action: str, target: str) -> list[dict[str, Any]]:
    return [a for a in api.get("/v1/audit", limit=1000) if a["action"] == action and a["target"] == target]


def _settle(api: Api) -> None:
    """Two reconciler passes: execute queued actions, then observe their effect (draining -> drained -> repair)."""
    for _ in range(2):
        api.tick()
        api.reconciler.run_once()


def test_every_operator_action_is_audited_with_the_callers_identity(api: Api) -> None:
    why = {"reason": "ticket OPS-17"}
    drained = _ok(api.post("/v1/nodes/r01-n01/drain", why, "operator"))
    assert drained["state"] == "draining"
    _ok(api.post("/v1/nodes/r01-n02/drain", why, "operator"))
    _settle(api)
    assert api.states()["r01-n01"] == "repair"
    assert _ok(api.post("/v1/nodes/r01-n01/repair-complete", why, "operator"))["state"] == "revalidate"
    assert _ok(api.post("/v1/nodes/r01-n02/resume", why, "operator"))["state"] == "revalidate"
    assert _ok(api.post("/v1/nodes/r02-n04/retire", why, "admin"))["state"] == "retired"

    # Two nodes are out of eight: a fatal event on a third is over budget and held.
    api.tick()
    _ok(api.post("/v1/events", {"events": [api.event("f-1", "r02-n01")]}, "agent"))
    assert api.get("/v1/breaker")["held"] == 1
    cancelled = _ok(api.post("/v1/nodes/r02-n01/cancel-held", why, "operator"))
    assert cancelled["state"] == "ready"
    _ok(api.post("/v1/events", {"events": [api.event("f-2", "r02-n02")]}, "agent"))
    assert api.get("/v1/breaker")["tripped"] is True
    _ok(api.post("/v1/breaker/reset", {"discard_held": True}, "operator"))
    assert _ok(api.client.put("/v1/mode", json={"dry_run": True}, headers=auth("operator"))) == {"dry_run": True}
    assert _ok(api.client.put("/v1/mode", json={"dry_run": False}, headers=auth("admin"))) == {"dry_run": False}

    expect = [
        ("decision", "r01-n01", "operator:alice", "operator_drain: ready -> draining: ticket OPS-17"),
        ("decision", "r01-n01", "operator:alice", "operator_repair_done: repair -> revalidate"),
        ("decision", "r01-n02", "operator:alice", "operator_resume: repair -> revalidate"),
        ("decision", "r02-n04", "admin:root", "operator_retire: ready -> retired"),
        ("cancel_held", "r02-n01", "operator:alice", "ticket OPS-17"),
        ("breaker_reset", "breaker", "operator:alice", "discarded"),
        ("dry_run", "mode", "operator:alice", "dry-run on"),
        ("dry_run", "mode", "admin:root", "dry-run off"),
    ]
    for action, target, who, detail in expect:
        entries = [a for a in _audit_of(api, action, target) if detail in a["detail"]]
        assert len(entries) == 1, (action, target, detail, _audit_of(api, action, target))
        assert entries[0]["actor"] == "operator"
        assert entries[0]["actor_id"] == who
    # The transitions carry the identity too.
    history = api.get("/v1/nodes/r01-n01")["history"]
    assert [h["actor_id"] for h in history if h["actor"] == "operator"] == ["operator:alice", "operator:alice"]


def test_retrying_a_failed_action_is_audited(api: Api) -> None:
    api.scheduler.set_reachable(False)
    _ok(api.post("/v1/nodes/r01-n01/drain", {}, "operator"))
    api.reconciler.execute(api.controller.store.due_actions(api.clock.now())[0])
    (action,) = api.get("/v1/actions", node="r01-n01")
    assert (action["status"], action["attempts"]) == ("pending", 1)
    r = api.post(f"/v1/actions/{action['id']}/retry", None, "operator")
    assert r.status_code == 409  # only failed actions can be retried
    api.controller.store.update_action(action["id"], status="failed", now=api.clock.now(), error="gave up")
    retried = _ok(api.post(f"/v1/actions/{action['id']}/retry", None, "operator"))
    assert (retried["status"], retried["attempts"]) == ("pending", 0)
    (entry,) = _audit_of(api, "retry_action", action["id"])
    assert entry["actor_id"] == "operator:alice"


def test_dry_run_records_decisions_and_creates_no_actions(api: Api) -> None:
    _ok(api.client.put("/v1/mode", json={"dry_run": True}, headers=auth("operator")))
    assert api.get("/v1/mode") == {"dry_run": True}
    api.tick()
    r = _ok(api.post("/v1/events", {"events": [api.event("f-1", "r01-n01"),
                                               api.event("d-1", "r02-n01", "check_failed", None)]}, "agent"))
    assert r["decisions"] == 2
    decisions = api.get("/v1/decisions")
    assert sorted((d["node"], d["status"], d["to_state"]) for d in decisions) == [
        ("r01-n01", "dry_run", "draining"), ("r02-n01", "dry_run", "draining")]
    assert api.get("/v1/actions") == []
    assert api.states()["r01-n01"] == "ready"
    assert api.get("/v1/status")["dry_run"] is True
    _settle(api)
    assert [e for e in api.scheduler.effects if e[0] == "drain"] == []
    assert {a["target"] for a in api.get("/v1/audit") if a["action"] == "dry_run_decision"} == {"r01-n01", "r02-n01"}

    # Dry-run off: the next fatal event is carried out.
    _ok(api.client.put("/v1/mode", json={"dry_run": False}, headers=auth("operator")))
    api.tick()
    _ok(api.post("/v1/events", {"events": [api.event("f-2", "r01-n01")]}, "agent"))
    assert api.states()["r01-n01"] == "draining"
    _settle(api)
    assert ("drain", "r01-n01") in [(e[0], e[1]) for e in api.scheduler.effects]


def test_approving_held_decisions_is_all_or_nothing(api: Api) -> None:
    """A request naming a node with no held decision approves nothing, and forgets nothing."""
    api.tick()
    for i, node in enumerate(("r01-n01", "r02-n01", "r02-n02")):  # budget 1 of 8: the 2nd and 3rd are held
        _ok(api.post("/v1/events", {"events": [api.event(f"f-{i}", node)]}, "agent"))
    assert api.get("/v1/breaker")["held"] == 2
    before = api.rows()

    for nodes in (["r02-n01", "r99-n99"], ["r02-n01", "r01-n03"], ["r02-n01", "r02-n01", "r01-n03"]):
        r = api.post("/v1/held/approve", {"nodes": nodes}, "operator")
        assert r.status_code == 404, r.text
        assert api.get("/v1/breaker")["held"] == 2
        assert api.rows() == before
        assert api.states()["r02-n01"] == "suspect"

    approved = _ok(api.post("/v1/held/approve", {"nodes": ["r02-n01", "r02-n01"]}, "operator"))
    assert approved["states"] == {"r02-n01": "draining"}
    assert api.get("/v1/breaker")["held"] == 1
    (entry,) = _audit_of(api, "approve_held", "r02-n01")
    assert entry["actor_id"] == "operator:alice"
