"""Event batches: accepted whole or refused whole; resent batches are deduplicated; agents report only
for their own nodes."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.api.conftest import Api


def _good(api: Api) -> list[dict[str, Any]]:
    """Three events that, stored, would drain r01-n01 (xid 79) and record two info events."""
    return [api.event("g-0", "r01-n02", "ecc_sbe", None), api.event("g-1", "r01-n01", "xid", 79),
            api.event("g-2", "r02-n01", "xid", 13)]


def _stored_nothing(api: Api, before: dict[str, int], states: dict[str, str]) -> None:
    assert api.get("/v1/events") == []
    assert api.get("/v1/decisions") == []
    assert api.rows() == before
    assert api.states() == states
    assert api.controller.state_of("r01-n01") == "ready"  # memory did not run ahead of the database


@pytest.mark.parametrize(("bad", "field"), [
    ({"node": "r99-n99"}, "events[2].node"),
    ({"time": "2026-11-21T12:00:01"}, "events[2].time"),
    ({"kind": "meltdown"}, "events[2].kind"),
    ({"id": "g-0", "node": "r01-n02"}, "events[2].id"),  # events[0]'s node and id: a duplicate within the batch
])
def test_one_bad_event_and_the_batch_stores_nothing(api: Api, bad: dict[str, Any], field: str) -> None:
    before, states = api.rows(), api.states()
    events = _good(api)
    events.insert(2, api.event("b-0", "r02-n02", "xid", 79) | bad)
    r = api.post("/v1/events", {"events": events}, "agent")
    assert r.status_code == 422
    assert [d["field"] for d in r.json()["detail"]] == [field]
    _stored_nothing(api, before, states)
    # The same batch without the bad event goes through whole.
    r = api.post("/v1/events", {"events": _good(api)}, "agent")
    assert r.status_code == 202, r.text
    assert r.json() == {"accepted": 3, "duplicates": 0, "decisions": 1}
    assert sorted(e["id"] for e in api.get("/v1/events")) == ["g-0", "g-1", "g-2"]
    assert api.states()["r01-n01"] == "draining"


def test_a_resent_batch_is_deduplicated(api: Api) -> None:
    batch = {"events": _good(api)}
    first = api.post("/v1/events", batch, "agent")
    assert first.json() == {"accepted": 3, "duplicates": 0, "decisions": 1}
    rows = api.rows()
    api.tick()
    again = api.post("/v1/events", batch, "agent")
    assert again.status_code == 202
    assert again.json() == {"accepted": 0, "duplicates": 3, "decisions": 0}
    assert api.rows() == rows
    mixed = api.post("/v1/events", {"events": [*batch["events"][:2], api.event("g-3", "r02-n02", "ecc_sbe", None)]},
                     "agent")
    assert mixed.json() == {"accepted": 1, "duplicates": 2, "decisions": 0}
    assert len(api.get("/v1/events")) == 4


def test_an_event_id_reused_for_another_payload_is_a_409_and_stores_nothing(api: Api) -> None:
    # Issue #16: a reused key with a different payload was silently a duplicate (and never acted on).
    first = api.post("/v1/events", {"events": [api.event("k-1", "r02-n01", "xid", 13)]}, "agent")
    assert first.json() == {"accepted": 1, "duplicates": 0, "decisions": 0}
    rows, states = api.rows(), api.states()
    reused = {"events": [api.event("k-2", "r02-n01", "ecc_sbe", None), api.event("k-1", "r02-n01", "ecc_dbe", None)]}
    r = api.post("/v1/events", reused, "agent")
    assert r.status_code == 409, r.text
    assert "events[1].id" in r.json()["detail"] and "'k-1'" in r.json()["detail"] and "kind" in r.json()["detail"]
    assert api.rows() == rows and api.states() == states
    # The same id on another node is another event; a true resend is still a duplicate.
    other = api.post("/v1/events", {"events": [api.event("k-1", "r02-n02", "ecc_dbe", None)]}, "agent")
    assert other.json() == {"accepted": 1, "duplicates": 0, "decisions": 1}
    again = api.post("/v1/events", {"events": [api.event("k-1", "r02-n01", "xid", 13)]}, "agent")
    assert again.json() == {"accepted": 0, "duplicates": 1, "decisions": 0}


def test_an_agent_reports_only_for_its_own_nodes(api: Api) -> None:
    before, states = api.rows(), api.states()
    mine, theirs = api.event("a-0", "r01-n01", "ecc_sbe", None), api.event("a-1", "r02-n01", "xid", 79)
    r = api.post("/v1/events", {"events": [mine, theirs]}, "agent-r01")
    assert r.status_code == 403
    assert "events[1].node" in r.json()["detail"]
    assert "r02-n01" in r.json()["detail"]
    _stored_nothing(api, before, states)

    now = api.clock.now().isoformat()
    assert api.post("/v1/nodes/r02-n01/heartbeat", {"time": now}, "agent-r01").status_code == 403
    assert api.get("/v1/nodes/r02-n01")["node"]["last_heartbeat"] is None

    assert api.post("/v1/events", {"events": [mine]}, "agent-r01").status_code == 202
    r = api.post("/v1/nodes/r01-n01/heartbeat", {"time": now, "agent_version": "0.1.0"}, "agent-r01")
    assert r.status_code == 200
    node = api.get("/v1/nodes/r01-n01")["node"]
    assert (node["agent_version"], node["last_heartbeat"] is not None) == ("0.1.0", True)
    # an agent token for every node may report for r02
    assert api.post("/v1/events", {"events": [theirs]}, "agent").status_code == 202


def test_events_are_listed_newest_first_with_filters(api: Api) -> None:
    api.post("/v1/events", {"events": _good(api)[:1]}, "agent")
    api.tick()
    api.post("/v1/events", {"events": _good(api)[1:]}, "agent")
    assert [e["id"] for e in api.get("/v1/events")] == ["g-2", "g-1", "g-0"]  # by time, then arrival
    assert [e["id"] for e in api.get("/v1/events", node="r01-n01")] == ["g-1"]
    assert [e["id"] for e in api.get("/v1/events", kind="ecc_sbe")] == ["g-0"]
    assert len(api.get("/v1/events", limit=1)) == 1
