"""Every /v1 route needs a valid bearer token, and a role that may do what the route does."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from tests.integration.api.conftest import ROLES, Api, auth

READ = {"viewer", "operator", "admin"}
REPORT = {"agent", "operator", "admin"}
OPERATE = {"operator", "admin"}
ADMIN = {"admin"}

# Who may call what: the API's access policy, written down. A route missing here fails the test.
ACCESS: dict[tuple[str, str], set[str]] = {
    ("GET", "/v1/health"): READ,
    ("GET", "/v1/ready"): READ,
    ("GET", "/v1/status"): READ,
    ("GET", "/v1/nodes"): READ,
    ("GET", "/v1/nodes/{node}"): READ,
    ("POST", "/v1/nodes"): ADMIN,
    ("POST", "/v1/nodes/{node}/heartbeat"): REPORT,
    ("PUT", "/v1/nodes/{node}/inventory"): REPORT,
    ("GET", "/v1/nodes/{node}/inventory"): READ,
    ("POST", "/v1/nodes/{node}/drain"): OPERATE,
    ("POST", "/v1/nodes/{node}/resume"): OPERATE,
    ("POST", "/v1/nodes/{node}/repair-complete"): OPERATE,
    ("POST", "/v1/nodes/{node}/retire"): OPERATE,
    ("POST", "/v1/nodes/{node}/burn-in"): OPERATE,
    ("POST", "/v1/nodes/{node}/cancel-held"): OPERATE,
    ("POST", "/v1/held/approve"): OPERATE,
    ("GET", "/v1/verdicts"): READ,
    ("GET", "/v1/ttm"): READ,
    ("POST", "/v1/events"): REPORT,
    ("GET", "/v1/events"): READ,
    ("GET", "/v1/decisions"): READ,
    ("GET", "/v1/actions"): READ,
    ("POST", "/v1/actions/{action_id}/retry"): OPERATE,
    ("GET", "/v1/audit"): READ,
    ("GET", "/v1/breaker"): READ,
    ("POST", "/v1/breaker/reset"): OPERATE,
    ("GET", "/v1/mode"): READ,
    ("PUT", "/v1/mode"): OPERATE,
    ("POST", "/v1/jobs/{job_id}/checkpoint"): REPORT,
    ("POST", "/v1/jobs/{job_id}/goodput"): REPORT,
    ("GET", "/v1/jobs/{job_id}/goodput"): READ,
    ("GET", "/v1/jobs/{job_id}/events"): READ,
    ("GET", "/v1/goodput"): READ,
    ("GET", "/v1/nodes/{node}/commands"): REPORT,
    ("POST", "/v1/nodes/{node}/commands/{command_id}/result"): REPORT,
    ("PUT", "/v1/nodes/{node}/commands/{command_id}/bundle"): REPORT,
    ("GET", "/v1/nodes/{node}/bundles"): READ,
    ("GET", "/v1/bundles/{bundle_id}"): READ,
    ("GET", "/v1/firmware"): READ,
    ("POST", "/v1/maintenance"): OPERATE,
    ("GET", "/v1/maintenance"): READ,
    ("GET", "/v1/maintenance/{rollout}"): READ,
    ("POST", "/v1/maintenance/{rollout}/start"): OPERATE,
    ("POST", "/v1/maintenance/{rollout}/pause"): OPERATE,
    ("POST", "/v1/maintenance/{rollout}/abort"): OPERATE,
    ("POST", "/v1/nodes/{node}/tenant"): ADMIN,
    ("GET", "/v1/tenancy"): READ,
    ("GET", "/v1/spares"): READ,
}

PARAMS = {"node": "r01-n01", "action_id": "d-0000000000000000:drain", "job_id": "job-1",
          "command_id": "d-0000000000000000:repair:1:gpu_reset", "bundle_id": "d-0000000000000000:repair:bundle",
          "rollout": "m-0000000000"}


def body_for(method: str, path: str, now: str) -> Any:
    """A well-formed body, so that only the credentials decide the answer."""
    if method == "GET":
        return None
    if path == "/v1/nodes":
        return {"nodes": [{"id": "r09-n01", "rack": "r09"}], "state": "ready"}
    if path == "/v1/events":
        return {"events": [{"id": "auth-e1", "node": "r01-n01", "kind": "ecc_sbe", "time": now}]}
    if path.endswith("/inventory"):
        return {"node": PARAMS["node"], "serial": "NODE-00001"}
    if path.endswith("/goodput"):
        hour_ago = (datetime.fromisoformat(now) - timedelta(hours=1)).isoformat()
        return {"intervals": [{"start": hour_ago, "end": now, "productive_s": 3600}]}
    if path.endswith(("/heartbeat", "/checkpoint")):
        return {"time": now}
    if path == "/v1/maintenance":
        return {"selector": "all", "action": "reboot"}
    if path == "/v1/mode":
        return {"dry_run": True}
    if path == "/v1/held/approve":
        return {"nodes": ["r01-n01"]}
    if path.endswith("/tenant"):
        return {"to": "globex"}
    if path == "/v1/breaker/reset":
        return {"discard_held": False}
    if path.endswith("/retry"):
        return None
    if path.endswith("/result"):
        return {"ok": True, "detail": "auth test"}
    if path.endswith("/bundle"):
        return {"node": "r01-n01", "nvml": {"status": "auth test"}}
    return {"reason": "auth test"}


def _walk(routes: Sequence[BaseRoute], prefix: str = "") -> Iterator[tuple[str, APIRoute]]:
    """Every APIRoute, also those in included routers (FastAPI >= 0.165 keeps them nested)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield prefix + route.path, route
            continue
        inner = getattr(route, "original_router", None)
        if inner is not None:
            extra = getattr(getattr(route, "include_context", None), "prefix", "")
            yield from _walk(inner.routes, prefix + extra)


def v1_routes(api: Api) -> list[tuple[str, str]]:
    out = []
    for path, route in _walk(api.app.routes):
        if path.startswith("/v1"):
            out += [(m, path) for m in sorted(route.methods)]
    return out


def _call(api: Api, method: str, path: str, headers: dict[str, str]) -> Any:
    url = re.sub(r"\{(\w+)\}", lambda m: PARAMS[m.group(1)], path)
    return api.client.request(method, url, json=body_for(method, path, api.clock.now().isoformat()), headers=headers)


def test_the_access_table_covers_every_route(api: Api) -> None:
    routes = v1_routes(api)
    assert len(routes) == len(set(routes))
    assert set(routes) == set(ACCESS), "routes added or removed: update ACCESS (and docs/api.md)"


def test_every_route_refuses_missing_and_wrong_tokens(api: Api) -> None:
    before = api.rows()
    bad_headers: dict[str, dict[str, str]] = {
        "no header": {},
        "empty bearer": {"Authorization": "Bearer "},
        "wrong token": {"Authorization": "Bearer not-a-token-of-ours-at-all"},
        "token of another scheme": {"Authorization": "Basic " + auth("admin")["Authorization"].split()[1]},
        "bare token": {"Authorization": auth("admin")["Authorization"].split()[1]},
    }
    wrong = []
    for method, path in v1_routes(api):
        for what, headers in bad_headers.items():
            r = _call(api, method, path, headers)
            if r.status_code != 401 or r.headers.get("www-authenticate") != "Bearer":
                wrong.append(f"{method} {path} with {what}: {r.status_code} {r.text}")
    assert wrong == []
    assert api.rows() == before


def test_every_route_refuses_roles_below_it_and_admits_the_others(api: Api) -> None:
    before = api.rows()
    wrong = []
    for method, path in v1_routes(api):
        allowed = ACCESS[(method, path)]
        for role in ROLES:
            if role in allowed:
                continue
            r = _call(api, method, path, auth(role))
            if r.status_code != 403 or role not in r.json()["detail"]:
                wrong.append(f"{method} {path} as {role}: {r.status_code} {r.text}")
    assert wrong == []
    assert api.rows() == before  # nothing a refused caller sent was stored
    for method, path in v1_routes(api):
        for role in sorted(ACCESS[(method, path)]):
            r = _call(api, method, path, auth(role))
            if r.status_code in (401, 403):
                wrong.append(f"{method} {path} as {role}: {r.status_code} {r.text}")
    assert wrong == []


def test_openapi_is_served_without_a_token_and_lists_every_route(api: Api) -> None:
    r = api.client.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    assert doc["info"]["title"] == "gpufleet controller"
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert documented == set(ACCESS)


def test_openapi_declares_the_bearer_scheme_on_every_v1_route(api: Api) -> None:
    doc = api.client.get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": "a token from controller.toml"}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op.get("security") == [{"bearer": []}], (method, path)
