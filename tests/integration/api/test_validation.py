"""Bad input: 422 naming the field path, the value and what was expected; unknown nodes: 404."""

from __future__ import annotations

import gc
from datetime import UTC, datetime
from typing import Any

import pytest

from gpufleet.controller.api.schemas import EventIn
from gpufleet.lifecycle.policy import sighting
from tests.integration.api.conftest import Api, auth
from tests.integration.api.test_auth import body_for, v1_routes


def _detail(r: Any, field: str | None = None) -> dict[str, Any]:
    """The one error in a 422 answer (or, when there are several, the one about ``field``)."""
    assert r.status_code == 422, r.text
    details = r.json()["detail"]
    assert all(set(d) == {"field", "value", "expected"} for d in details), details
    if field is not None and len(details) > 1:
        details = [d for d in details if d["field"] == field]
    (d,) = details
    return dict(d)


def _batch(api: Api, second: dict[str, Any]) -> dict[str, Any]:
    return {"events": [api.event("ok-0", "r01-n01", "ecc_sbe", None), second]}


@pytest.mark.parametrize(("change", "field", "value", "expected"), [
    ({"time": "2026-11-21T12:00:00"}, "events[1].time", "2026-11-21T12:00:00", "timezone"),
    ({"time": "yesterday"}, "events[1].time", "yesterday", "datetime"),
    ({"kind": "xid_bogus"}, "events[1].kind", "xid_bogus", "'xid'"),
    ({"code": -1}, "events[1].code", -1, "greater than or equal to 0"),
    ({"code": "79x"}, "events[1].code", "79x", "integer"),
    ({"severity": "apocalyptic"}, "events[1].severity", "apocalyptic", "'fatal'"),
    ({"colour": "red"}, "events[1].colour", "red", "Extra inputs"),
    ({"id": ""}, "events[1].id", "", "at least 1 character"),
    ({"attrs": {"n": 1}}, "events[1].attrs.n", 1, "string"),
    ({"code": 2**31}, "events[1].code", 2**31, "less than or equal to 2147483647"),
    ({"message": "disk\u0000full"}, "events[1].message", "disk\u0000full", "NUL"),
    ({"attrs": {"k": "a\u0000"}}, "events[1].attrs.k", "a\u0000", "NUL"),
])
def test_a_malformed_event_names_its_field_and_value(api: Api, change: dict[str, Any], field: str, value: Any,
                                                     expected: str) -> None:
    second = api.event("bad-1", "r01-n02") | change
    d = _detail(api.post("/v1/events", _batch(api, second), "agent"))
    assert (d["field"], d["value"]) == (field, value)
    assert expected in d["expected"]


def test_a_missing_field_is_named(api: Api) -> None:
    second = api.event("bad-1", "r01-n02")
    del second["node"]
    d = _detail(api.post("/v1/events", _batch(api, second), "agent"))
    assert d["field"] == "events[1].node"
    assert d["expected"] == "Field required"


@pytest.mark.parametrize(("method", "path", "body", "field", "value"), [
    ("POST", "/v1/events", {"events": []}, "events", "[]"),
    ("POST", "/v1/nodes", {"nodes": [{"id": "bad id!", "rack": "r01"}]}, "nodes[0].id", "bad id!"),
    ("POST", "/v1/nodes", {"nodes": [{"id": "r05-n01", "rack": "r05"}], "state": "drained"}, "state", "drained"),
    ("POST", "/v1/nodes", {"nodes": [{"id": "r05-n01", "rack": "r05", "gpus": [{"index": -2}]}]},
     "nodes[0].gpus[0].index", -2),
    ("PUT", "/v1/mode", {"dry_run": "maybe"}, "dry_run", "maybe"),
    ("POST", "/v1/nodes/r01-n01/heartbeat", {"time": "2026-11-21T12:00:00"}, "time", "2026-11-21T12:00:00"),
    ("POST", "/v1/nodes/r01-n01/drain", {"reason": 7}, "reason", 7),
    ("POST", "/v1/breaker/reset", {"discard_held": "sure"}, "discard_held", "sure"),
    ("POST", "/v1/jobs/j1/checkpoint", {"when": "now"}, "when", "now"),
    ("GET", "/v1/nodes?limit=0", None, "limit", "0"),
    ("GET", "/v1/nodes?state=broken", None, "state", "broken"),
    ("GET", "/v1/events?since=noon", None, "since", "noon"),
    ("GET", "/v1/audit?offset=-1", None, "offset", "-1"),
])
def test_malformed_bodies_and_parameters_everywhere(api: Api, method: str, path: str, body: Any, field: str,
                                                    value: Any) -> None:
    before = api.rows()
    r = api.client.request(method, path, json=body, headers=auth("admin"))
    d = _detail(r, field)
    assert (d["field"], d["value"]) == (field, value)
    assert d["expected"]
    assert api.rows() == before


def test_every_node_route_answers_404_for_an_unknown_node(api: Api) -> None:
    wrong = []
    for method, path in v1_routes(api):
        if "{node}" not in path:
            continue
        url = path.replace("{node}", "r99-n99")
        body = body_for(method, path, api.clock.now().isoformat())
        r = api.client.request(method, url, json=body, headers=auth("admin"))
        if r.status_code != 404 or "r99-n99" not in r.text:
            wrong.append(f"{method} {url}: {r.status_code} {r.text}")
    assert wrong == []
    r = api.post("/v1/actions/d-nope:drain/retry", None, "operator")
    assert r.status_code == 404
    assert "d-nope:drain" in r.text


def test_an_event_for_an_unknown_node_is_refused_with_its_field(api: Api) -> None:
    d = _detail(api.post("/v1/events", _batch(api, api.event("e1", "r99-n99")), "agent"))
    assert (d["field"], d["value"]) == ("events[1].node", "r99-n99")
    assert "registered node" in d["expected"]


def test_a_body_that_is_not_json_is_reported_against_the_body(api: Api) -> None:
    r = api.client.post("/v1/events", content=b'{"events": [', headers=auth("agent") | {
        "content-type": "application/json"})
    d = _detail(r)
    assert d["field"] == "body"
    assert "JSON" in d["expected"]
    assert "character 12" in d["expected"]


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer not-a-token"}, {"authorization": "Basic abc"}])
def test_a_body_that_is_not_json_from_an_unknown_caller_gets_401_not_422(api: Api, headers: dict[str, str]) -> None:
    before = api.rows()
    r = api.client.post("/v1/events", content=b'{"events": [', headers=headers | {"content-type": "application/json"})
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == "Bearer"
    assert "JSON" not in r.text  # nothing about the body leaks to a caller that is not authenticated
    assert api.rows() == before


def test_event_times_with_any_offset_become_the_same_instant_on_the_one_utc_object() -> None:
    # The controller keeps event times for the escalation windows: each must use the stdlib UTC object,
    # not a tzinfo object of its own that the cycle collector would then have to walk (docs/benchmarks.md).
    e = EventIn.model_validate({"id": "tz-1", "node": "r01-n01", "kind": "ecc_sbe",
                                "time": "2026-11-21T14:30:00+02:00"}).to_domain()
    assert e.time.tzinfo is UTC
    assert e.time == datetime(2026, 11, 21, 12, 30, tzinfo=UTC)
    seen = sighting(e)
    gc.collect(0)  # CPython drops a tuple of atomic values from the collector when it first examines it
    assert not gc.is_tracked(seen)
