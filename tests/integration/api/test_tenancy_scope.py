"""Tenant-scoped tokens on every /v1 route (docs/tenancy.md): acme's viewer and operator against globex's
node. A route about one node answers 404 (as for a node that does not exist), a listing shows none of
globex's nodes, a fleet-wide route answers 403; nothing a refused caller sent is stored. A route without
a decision in TENANCY fails the first test."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest

from gpufleet.controller.store.repairs import RepairStore
from tests.integration.api.conftest import Api, auth
from tests.integration.api.test_auth import ACCESS, PARAMS, body_for, v1_routes

pytestmark = pytest.mark.tenancy

NODE, LIST, FLEET, NEUTRAL, ADMIN_ONLY = "node", "list", "fleet", "neutral", "admin"

# What a tenant-scoped token gets on each route: the tenancy decision, written down.
TENANCY: dict[tuple[str, str], str] = {
    ("GET", "/v1/health"): NEUTRAL,
    ("GET", "/v1/ready"): FLEET,
    ("GET", "/v1/status"): FLEET,
    ("GET", "/v1/nodes"): LIST,
    ("GET", "/v1/nodes/{node}"): NODE,
    ("POST", "/v1/nodes"): ADMIN_ONLY,
    ("POST", "/v1/nodes/{node}/heartbeat"): NODE,
    ("PUT", "/v1/nodes/{node}/inventory"): NODE,
    ("GET", "/v1/nodes/{node}/inventory"): NODE,
    ("POST", "/v1/nodes/{node}/drain"): NODE,
    ("POST", "/v1/nodes/{node}/resume"): NODE,
    ("POST", "/v1/nodes/{node}/repair-complete"): NODE,
    ("POST", "/v1/nodes/{node}/retire"): NODE,
    ("POST", "/v1/nodes/{node}/burn-in"): NODE,
    ("POST", "/v1/nodes/{node}/cancel-held"): NODE,
    ("POST", "/v1/held/approve"): NODE,  # the body names globex's node
    ("GET", "/v1/verdicts"): LIST,
    ("GET", "/v1/ttm"): FLEET,
    ("POST", "/v1/events"): NODE,  # the body names globex's node
    ("GET", "/v1/events"): LIST,
    ("GET", "/v1/decisions"): LIST,
    ("GET", "/v1/actions"): LIST,
    ("POST", "/v1/actions/{action_id}/retry"): NODE,  # an action on globex's node
    ("GET", "/v1/audit"): LIST,
    ("GET", "/v1/breaker"): FLEET,
    ("POST", "/v1/breaker/reset"): FLEET,
    ("GET", "/v1/mode"): NEUTRAL,
    ("PUT", "/v1/mode"): FLEET,
    ("POST", "/v1/jobs/{job_id}/checkpoint"): NODE,  # a job running on globex's node
    ("POST", "/v1/jobs/{job_id}/goodput"): NODE,
    ("GET", "/v1/jobs/{job_id}/goodput"): NODE,
    ("GET", "/v1/jobs/{job_id}/events"): NODE,
    ("GET", "/v1/goodput"): FLEET,
    ("GET", "/v1/nodes/{node}/commands"): NODE,
    ("POST", "/v1/nodes/{node}/commands/{command_id}/result"): NODE,
    ("PUT", "/v1/nodes/{node}/commands/{command_id}/bundle"): NODE,
    ("GET", "/v1/nodes/{node}/bundles"): NODE,
    ("GET", "/v1/bundles/{bundle_id}"): NODE,  # a bundle of globex's node
    ("GET", "/v1/firmware"): LIST,
    ("POST", "/v1/maintenance"): FLEET,
    ("GET", "/v1/maintenance"): LIST,
    ("GET", "/v1/maintenance/{rollout}"): NODE,  # a rollout of globex's nodes
    ("POST", "/v1/maintenance/{rollout}/start"): FLEET,
    ("POST", "/v1/maintenance/{rollout}/pause"): FLEET,
    ("POST", "/v1/maintenance/{rollout}/abort"): FLEET,
    ("POST", "/v1/nodes/{node}/tenant"): ADMIN_ONLY,
    ("GET", "/v1/tenancy"): LIST,
    ("GET", "/v1/spares"): FLEET,  # the pools span tenants' nodes
}
OTHER = "r02-n01"  # globex's
MINE = "r01-n01"  # acme's


def test_the_tenancy_table_covers_every_route(api: Api) -> None:
    assert set(v1_routes(api)) == set(TENANCY), "a route added or removed: decide what a tenant token gets there"


def _globex_world(api: Api) -> dict[str, str]:
    """Real things of globex's for the path parameters: an action, a job, a bundle, a rollout; plus an
    event on each tenant's node so listings have something to leave out."""
    now = api.clock.now()
    for eid, node in (("e-other", OTHER), ("e-mine", MINE)):
        assert api.post("/v1/events", {"events": [api.event(eid, node, kind="ecc_sbe", code=None)]}).status_code == 202
    assert api.post(f"/v1/nodes/{OTHER}/drain", {"reason": "globex's"}).status_code == 200
    action = api.get("/v1/actions", who="admin", node=OTHER)[0]["id"]
    job = api.scheduler.submit("train", [OTHER], start=now)
    RepairStore(api.controller.store).enqueue("d-globex:repair:bundle", OTHER, "diagnostic_bundle", now)
    r = api.client.put(f"/v1/nodes/{OTHER}/commands/d-globex:repair:bundle/bundle", json={"node": OTHER},
                       headers=auth("admin"))
    assert r.status_code == 201, r.text
    inv = api.client.put(f"/v1/nodes/{OTHER}/inventory", json={"node": OTHER, "serial": "G-1"}, headers=auth("admin"))
    assert inv.status_code == 200, inv.text
    hour_ago = (now - timedelta(hours=1)).isoformat()
    gp = api.post(f"/v1/jobs/{job.id}/goodput", {"intervals": [{"start": hour_ago, "end": now.isoformat(),
                                                               "productive_s": 3600}]})
    assert gp.status_code == 202, gp.text
    rollout = api.post("/v1/maintenance", {"selector": "nodes:r02-n02", "action": "reboot"}).json()["id"]
    api.tick(timedelta(seconds=5))
    return {"node": OTHER, "action_id": action, "job_id": job.id, "bundle_id": "d-globex:repair:bundle",
            "command_id": "d-globex:repair:bundle", "rollout": rollout}


def _call(api: Api, method: str, path: str, params: dict[str, str], who: str) -> Any:
    url = re.sub(r"\{(\w+)\}", lambda m: params.get(m.group(1), PARAMS[m.group(1)]), path)
    body = body_for(method, path, api.clock.now().isoformat())
    if body is not None:  # every body that names a node names globex's
        body = json.loads(json.dumps(body).replace(MINE, OTHER))
    return api.client.request(method, url, json=body, headers=auth(who))


@pytest.mark.parametrize("who", ["acme-viewer", "acme-operator"])
def test_a_tenant_token_neither_sees_nor_acts_on_another_tenants_nodes(api: Api, who: str) -> None:
    params = _globex_world(api)
    role = who.split("-")[1]
    before = api.rows()
    wrong = []
    for method, path in v1_routes(api):
        decision = TENANCY[(method, path)]
        if role not in ACCESS[(method, path)]:
            continue  # refused for its role already (test_auth)
        r = _call(api, method, path, params, who)
        ok = {NODE: r.status_code == 404,
              LIST: r.status_code == 200 and "r02-" not in r.text,
              FLEET: r.status_code == 403 and "tenant" in r.text,
              NEUTRAL: r.status_code == 200}[decision]
        if not ok:
            wrong.append(f"{method} {path} ({decision}) as {who}: {r.status_code} {r.text[:300]}")
    assert wrong == []
    assert api.rows() == before, "nothing a tenant sent about another tenant's node was stored"


def test_a_tenant_token_sees_and_acts_on_its_own_nodes(api: Api) -> None:
    _globex_world(api)
    nodes = [n["id"] for n in api.get("/v1/nodes", who="acme-viewer", limit=1000)]
    assert nodes == [n for n in api.nodes if n.startswith("r01-")]
    assert [e["id"] for e in api.get("/v1/events", who="acme-viewer")] == ["e-mine"]
    assert api.get(f"/v1/nodes/{MINE}", who="acme-viewer")["node"]["id"] == MINE
    r = api.post(f"/v1/nodes/{MINE}/drain", {"reason": "acme's own"}, who="acme-operator")
    assert r.status_code == 200 and r.json()["state"] in ("draining", "drained")
    audit = api.get("/v1/audit", who="acme-viewer", limit=1000)
    assert audit and {a["target"] for a in audit} <= {n for n in api.nodes if n.startswith("r01-")}
    assert [t["name"] for t in api.get("/v1/tenancy", who="acme-viewer")["tenants"]] == ["acme"]
    # admins and unscoped tokens see every node, as before
    assert len(api.get("/v1/nodes", who="viewer", limit=1000)) == len(api.nodes)
    assert {e["id"] for e in api.get("/v1/events", who="admin")} == {"e-other", "e-mine"}


def test_the_fleet_wide_pages_refuse_a_tenant_token(api: Api) -> None:
    assert api.client.get("/metrics", headers=auth("acme-viewer")).status_code == 403
    assert api.client.get("/metrics", headers=auth("viewer")).status_code == 200
    r = api.client.post("/ui/login", data={"token": "acme-viewer-token-001"}, follow_redirects=False)
    assert r.status_code == 401  # the web UI shows the whole fleet
    assert api.client.get("/", headers=auth("acme-viewer"), follow_redirects=False).status_code != 200


def test_the_only_way_to_another_tenant_is_a_move_that_releases_the_node_first(api: Api) -> None:
    node = "r01-n02"
    writes = [(m, p) for m, p in v1_routes(api) if m != "GET" and "tenant" in p]
    assert writes == [("POST", "/v1/nodes/{node}/tenant")], "no other route touches a node's tenant"
    assert api.post(f"/v1/nodes/{node}/tenant", {"to": "globex"}, who="acme-operator").status_code == 403
    r = api.post(f"/v1/nodes/{node}/tenant", {"to": "globex", "reason": "rebalance"})
    assert r.status_code == 202, r.text
    move = r.json()
    assert (move["state"], move["from_tenant"], move["to_tenant"]) == ("running", "acme", "globex")
    assert api.client.get(f"/v1/nodes/{node}", headers=auth("acme-viewer")).status_code == 404, \
        "released: the old tenant no longer sees it"
    assert node not in {n for t in api.get("/v1/tenancy")["tenants"] for n in t["nodes"]}, "and nobody owns it"
    assert api.post(f"/v1/nodes/{node}/tenant", {"to": "acme"}).status_code == 409  # one move at a time
    assert api.post(f"/v1/nodes/{node}/tenant", {"to": "initech"}).status_code == 422
    audit = api.get("/v1/audit", who="admin", target=node)
    assert audit[-1]["action"] == "tenancy_move" or "tenancy_move" in [a["action"] for a in audit]
    rollout = api.get(f"/v1/maintenance/{move['rollout']}", who="admin")
    assert rollout["state"] == "running" and [n["node"] for n in rollout["nodes"]] == [node]


@pytest.mark.parametrize("who", ["acme-viewer", "acme-operator"])
def test_another_tenants_node_answers_exactly_as_a_node_that_does_not_exist(api: Api, who: str) -> None:
    params = _globex_world(api)
    role = who.split("-")[1]
    differ = []
    for method, path in v1_routes(api):
        if "{node}" not in path or role not in ACCESS[(method, path)]:
            continue
        theirs = _call(api, method, path, params, who)
        nobody = _call(api, method, path, params | {"node": "r99-n99"}, who)
        if (theirs.status_code, theirs.text.replace(OTHER, "r99-n99")) != (nobody.status_code, nobody.text):
            differ.append(f"{method} {path}: {theirs.status_code} {theirs.text[:120]} / {nobody.status_code} "
                          f"{nobody.text[:120]}")
    assert differ == []
