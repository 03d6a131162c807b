"""Followers: what needs the leader goes to the leader, the rest is answered from the database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpufleet.controller.api.forward import FORWARDED, needs_leader
from tests.integration.ha.replicas import HEADERS, Replica, settled

pytestmark = [pytest.mark.ha, pytest.mark.postgres]


@pytest.mark.parametrize(("method", "path", "leader"), [
    ("POST", "/v1/events", True), ("POST", "/v1/nodes/n1/heartbeat", True), ("PUT", "/v1/mode", True),
    ("POST", "/v1/nodes/n1/drain", True), ("GET", "/v1/mode", True), ("GET", "/v1/status", True),
    ("GET", "/v1/verdicts", True), ("GET", "/ui/nodes", True), ("GET", "/", True),
    ("GET", "/v1/nodes/n1/commands", True), ("GET", "/v1/nodes/n1/bundles", True), ("GET", "/v1/nodes/n1", False),
    ("GET", "/v1/nodes", False), ("GET", "/v1/events", False), ("GET", "/v1/actions", False),
    ("GET", "/v1/health", False), ("GET", "/metrics", False), ("GET", "/ui/static/app.css", False),
])
def test_what_a_follower_forwards(method: str, path: str, leader: bool) -> None:
    assert needs_leader(method, path) is leader


@pytest.fixture
def pair(tmp_path: Path, pg_url: str) -> Iterator[list[Replica]]:
    group = [Replica(tmp_path, name, pg_url, 2.0, 0.5) for name in ("a", "b")]
    yield group
    for r in group:
        r.kill9()


def test_a_follower_forwards_operators_writes_and_reads_of_the_leaders_memory(pair: list[Replica]) -> None:
    for r in pair:
        r.start()
    assert all(r.serving() for r in pair)
    lead, _epoch = settled(pair)
    follower = next(r for r in pair if r is not lead)
    with httpx.Client(base_url=f"{follower.base}/v1", headers=HEADERS, timeout=10) as http:
        assert http.put("/mode", json={"dry_run": True}).json() == {"dry_run": True}
        assert http.get("/mode").json() == {"dry_run": True}  # the leader's memory, through the follower
        assert http.get("/status").json()["dry_run"] is True
        r = http.post("/nodes/r01-n001/drain", json={"reason": "via the follower"})
        assert r.status_code == 200, r.text
        [node] = [n for n in http.get("/nodes", params={"limit": 1000}).json() if n["id"] == "r01-n001"]
        assert node["state"] in ("draining", "drained")  # read from the database by the follower itself
        assert http.get("/health").json()["role"] == "follower"
        refused = http.put("/mode", json={"dry_run": False}, headers={FORWARDED: "elsewhere"})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert "not the leader" in refused.json()["detail"]
    with httpx.Client(base_url=f"{lead.base}/v1", headers=HEADERS, timeout=10) as http:
        assert http.get("/mode").json() == {"dry_run": True}
        audit = http.get("/audit", params={"target": "r01-n001"}).json()
        assert any("via the follower" in a["detail"] for a in audit)
