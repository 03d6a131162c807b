"""The fake API server against recorded responses of real API servers (tests/k8s/recorded/README.md)
and against the semantics the adapter relies on."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.k8s.fakeapi import FakeKubeAPI
from tests.k8s.harness import NAMESPACE, gpu_pod, node_object, running

pytestmark = pytest.mark.kubernetes
RECORDED = Path(__file__).parent / "recorded"


def recorded(name: str) -> Any:
    return json.loads((RECORDED / name).read_text())


def shape(value: Any) -> Any:
    """Keys and value types, recursively (lists by their first element)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def wording(message: str) -> str:
    """A message with its names and numbers blanked: what stays must match the recording."""
    return re.sub(r"\d+", "N", re.sub(r'(budget|on \w+) \\?"?[a-z0-9.-]+\\?"?', r"\1 X", message))


@pytest.fixture
def api() -> Any:
    with FakeKubeAPI(bookmark_interval=0.2) as fake:
        yield fake


def test_eviction_refused_by_a_budget_answers_like_a_real_server(api: FakeKubeAPI) -> None:
    api.put("nodes", node_object("n1"))
    api.put("pods", running(gpu_pod("w-0", "w", "n1")))
    api.put("poddisruptionbudgets", {"metadata": {"name": "w-pdb", "namespace": NAMESPACE},
                                     "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "w"}}}})
    r = httpx.post(f"{api.url}/api/v1/namespaces/{NAMESPACE}/pods/w-0/eviction",
                   json={"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "w-0"}})
    real = recorded("eviction-429.json")
    assert r.status_code == real["code"] == 429
    assert shape(r.json()) == shape(real)
    assert r.json()["reason"] == real["reason"] and r.json()["message"] == real["message"]
    cause, real_cause = r.json()["details"]["causes"][0], real["details"]["causes"][0]
    assert cause["reason"] == real_cause["reason"]
    assert wording(cause["message"]) == wording(real_cause["message"])
    assert api.get("pods", "w-0", NAMESPACE) is not None, "a refused eviction deletes nothing"


def test_eviction_without_a_budget_deletes_the_pod(api: FakeKubeAPI) -> None:
    api.put("pods", running(gpu_pod("w-0", "w", "n1")))
    r = httpx.post(f"{api.url}/api/v1/namespaces/{NAMESPACE}/pods/w-0/eviction",
                   json={"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "w-0"}})
    assert r.status_code == 201
    assert api.get("pods", "w-0", NAMESPACE) is None


def test_two_budgets_on_one_pod_is_a_server_error(api: FakeKubeAPI) -> None:
    api.put("pods", running(gpu_pod("w-0", "w", "n1")))
    for name in ("a", "b"):
        api.put("poddisruptionbudgets", {"metadata": {"name": name, "namespace": NAMESPACE},
                                         "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "w"}}}})
    r = httpx.post(f"{api.url}/api/v1/namespaces/{NAMESPACE}/pods/w-0/eviction", json={})
    assert r.status_code == 500
    assert api.get("pods", "w-0", NAMESPACE) is not None


def test_stale_resource_version_is_a_conflict_like_a_real_server(api: FakeKubeAPI) -> None:
    api.put("nodes", node_object("n1"))
    stale = api.get("nodes", "n1")
    assert stale is not None
    api.put("nodes", {**stale, "metadata": {**stale["metadata"], "labels": {"x": "y"}}})
    r = httpx.patch(f"{api.url}/api/v1/nodes/n1",
                    content=json.dumps({"metadata": {"resourceVersion": stale["metadata"]["resourceVersion"]},
                                        "spec": {"unschedulable": True}}),
                    headers={"Content-Type": "application/strategic-merge-patch+json"})
    real = recorded("conflict-409.json")
    assert r.status_code == real["code"] == 409
    assert shape(r.json()) == shape(real)
    assert r.json()["reason"] == real["reason"]
    assert wording(r.json()["message"]) == wording(real["message"]).replace("resourcequotas", "nodes")
    assert not (api.get("nodes", "n1") or {}).get("spec", {}).get("unschedulable")


def test_strategic_merge_on_conditions_merges_by_type_and_taints_replace(api: FakeKubeAPI) -> None:
    api.put("nodes", {**node_object("n1"), "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}})
    smp = {"Content-Type": "application/strategic-merge-patch+json"}
    cond = {"type": "GpufleetHealthy", "status": "False", "reason": "R", "message": "m"}
    assert httpx.patch(f"{api.url}/api/v1/nodes/n1/status", headers=smp,
                       content=json.dumps({"status": {"conditions": [cond]}})).status_code == 200
    taints = {"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}}
    assert httpx.patch(f"{api.url}/api/v1/nodes/n1", headers=smp, content=json.dumps(taints)).status_code == 200
    node = api.get("nodes", "n1") or {}
    assert {c["type"] for c in node["status"]["conditions"]} == {"Ready", "GpufleetHealthy"}
    assert [t["key"] for t in node["spec"]["taints"]] == ["b"]


def test_main_resource_ignores_status_and_status_subresource_ignores_spec(api: FakeKubeAPI) -> None:
    api.put("nodes", node_object("n1"))
    merge = {"Content-Type": "application/merge-patch+json"}
    httpx.patch(f"{api.url}/api/v1/nodes/n1", headers=merge, content=json.dumps({"status": {"phase": "X"}}))
    httpx.patch(f"{api.url}/api/v1/nodes/n1/status", headers=merge,
                content=json.dumps({"spec": {"unschedulable": True}}))
    node = api.get("nodes", "n1") or {}
    assert "phase" not in node["status"]
    assert not node["spec"].get("unschedulable")


def test_json_patch_test_op_guards_the_write(api: FakeKubeAPI) -> None:
    api.put("nodes", node_object("n1"))
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": "0"},
           {"op": "add", "path": "/spec/unschedulable", "value": True}]
    r = httpx.patch(f"{api.url}/api/v1/nodes/n1", headers={"Content-Type": "application/json-patch+json"},
                    content=json.dumps(ops))
    assert r.status_code == 409


def _watch(api: FakeKubeAPI, query: str) -> list[dict[str, Any]]:
    with httpx.stream("GET", f"{api.url}/api/v1/nodes?watch=true&{query}", timeout=10) as r:
        return [json.loads(line) for line in r.iter_lines() if line]


def test_watch_from_an_expired_resource_version_gets_410_like_a_real_server(api: FakeKubeAPI) -> None:
    api.put("nodes", node_object("n1"))
    old = (api.get("nodes", "n1") or {})["metadata"]["resourceVersion"]
    api.put("nodes", node_object("n2"))
    api.compact()
    events = _watch(api, f"resourceVersion={old}&timeoutSeconds=1")
    real = recorded("watch-410.json")
    assert len(events) == 1
    assert shape(events[0]) == shape(real)
    assert (events[0]["type"], events[0]["object"]["code"], events[0]["object"]["reason"]) == ("ERROR", 410, "Expired")
    assert wording(events[0]["object"]["message"]) == wording(real["object"]["message"])


def test_watch_streams_changes_then_a_bookmark_like_the_documented_one(api: FakeKubeAPI) -> None:
    api.put("nodes", node_object("n1"))
    start = (api.get("nodes", "n1") or {})["metadata"]["resourceVersion"]
    api.put("nodes", node_object("n2"))
    events = _watch(api, f"resourceVersion={start}&allowWatchBookmarks=true&timeoutSeconds=1")
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in events[:1]] == [("ADDED", "n2")]
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert bookmarks, "a watch with allowWatchBookmarks ends with a bookmark"
    assert shape({**bookmarks[-1], "object": {**bookmarks[-1]["object"], "kind": "Pod"}}) == \
        shape(recorded("watch-bookmark.json"))
    assert int(bookmarks[-1]["object"]["metadata"]["resourceVersion"]) >= int(
        (api.get("nodes", "n2") or {})["metadata"]["resourceVersion"])


def test_list_items_carry_no_kind_and_the_list_a_resource_version(api: FakeKubeAPI) -> None:
    api.put("nodes", node_object("n1"))
    body = httpx.get(f"{api.url}/api/v1/nodes").json()
    assert body["kind"] == "NodeList" and body["metadata"]["resourceVersion"]
    assert "kind" not in body["items"][0]


def test_field_selector_on_node_name_and_phase(api: FakeKubeAPI) -> None:
    api.put("pods", running(gpu_pod("a", "a", "n1")))
    api.put("pods", running(gpu_pod("b", "b", "n2")))
    done = gpu_pod("c", "c", "n1")
    done["status"] = {"phase": "Succeeded"}
    api.put("pods", done)
    body = httpx.get(f"{api.url}/api/v1/pods",
                     params={"fieldSelector": "spec.nodeName=n1,status.phase!=Succeeded"}).json()
    assert [p["metadata"]["name"] for p in body["items"]] == ["a"]
