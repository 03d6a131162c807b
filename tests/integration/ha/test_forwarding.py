"""Followers: what needs the leader goes to the leader, the rest is answered from the database."""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from gpufleet.controller.api.forward import FORWARDED, needs_leader
from tests.integration.ha.replicas import HEADERS, Replica, settled

pytestmark = [pytest.mark.ha, pytest.mark.postgres]


def started(group: list[Replica]) -> tuple[Replica, Replica]:
    """Start ``group``; its leader once settled, and a follower."""
    for r in group:
        r.start()
    assert all(r.serving() for r in group)
    lead, _epoch = settled(group)
    return lead, next(r for r in group if r is not lead)


@pytest.mark.parametrize(("method", "path", "leader"), [
    ("POST", "/v1/events", True), ("POST", "/v1/nodes/n1/heartbeat", True), ("PUT", "/v1/mode", True),
    ("POST", "/v1/nodes/n1/drain", True), ("GET", "/v1/mode", True), ("GET", "/v1/status", True),
    ("GET", "/v1/verdicts", True), ("GET", "/ui/nodes", True), ("GET", "/", True),
    ("GET", "/v1/nodes/n1/commands", True), ("GET", "/v1/nodes/n1/bundles", True), ("GET", "/v1/nodes/n1", False),
    ("GET", "/v1/nodes", False), ("GET", "/v1/events", False), ("GET", "/v1/actions", False),
    ("GET", "/v1/health", False), ("GET", "/metrics", False), ("GET", "/ui/static/app.css", False),
    # the leader's memory: the spares runner's plan, the BMC watcher's firmware, the tenants' nodes now
    ("GET", "/v1/spares", True), ("GET", "/v1/firmware", True), ("GET", "/v1/tenancy", True),
])

def test_what_a_follower_forwards(method: str, path: str, leader: bool) -> None:
    assert needs_leader(method, path) is leader


@pytest.fixture
def pair(tmp_path: Path, pg_url: str) -> Iterator[list[Replica]]:
    group = [Replica(tmp_path, name, pg_url, 2.0, 0.5) for name in ("a", "b")]
    yield group
    for r in group:
        r.close()


def test_a_follower_forwards_operators_writes_and_reads_of_the_leaders_memory(pair: list[Replica]) -> None:
    lead, follower = started(pair)
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


ACME = "acme-viewer-token-0123456789"
TENANTS = f"""
[[tokens]]
name = "acme-viewer"
role = "viewer"
token = "{ACME}"
tenant = "acme"

[[tenant]]
name = "acme"
nodes = ["r01-*"]
"""


def counter(replica: Replica, name: str, label: str) -> float:
    """One sample of a counter on ``replica``'s /metrics (0 when it has none yet)."""
    text = httpx.get(f"{replica.base}/metrics", headers=HEADERS, timeout=10).text
    m = re.search(rf'^gpufleet_{name}_total{{[a-z]+="{label}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.fixture
def tenants(tmp_path: Path, pg_url: str) -> Iterator[list[Replica]]:
    group = [Replica(tmp_path, name, pg_url, 2.0, 0.5, settings=TENANTS) for name in ("a", "b")]
    yield group
    for r in group:
        r.close()


def test_a_follower_answers_tenant_reads_as_the_leader_knows_them(tenants: list[Replica]) -> None:
    """A node registered after the follower started: its tenant's token sees it through the follower,
    and /v1/tenancy lists it (the follower's own memory of the nodes and owners is its start's)."""
    lead, follower = started(tenants)
    with httpx.Client(base_url=f"{lead.base}/v1", headers=HEADERS, timeout=10) as http:
        r = http.post("/nodes", json={"nodes": [{"id": "r01-n999", "rack": "r01"}], "state": "ready"})
        assert r.status_code == 201, r.text
    with httpx.Client(base_url=f"{follower.base}/v1", timeout=10) as http:
        admin = http.get("/tenancy", headers=HEADERS).json()
        [acme] = admin["tenants"]
        assert "r01-n999" in acme["nodes"] and "r01-n001" in acme["nodes"]
        scoped = {"Authorization": f"Bearer {ACME}"}
        seen = {n["id"] for n in http.get("/nodes", params={"limit": 1000}, headers=scoped).json()}
        assert "r01-n999" in seen and "r01-n001" in seen
        assert all(n.startswith("r01-") for n in seen)
        assert http.get("/tenancy", headers=scoped).json()["tenants"] == admin["tenants"]
        assert http.get("/nodes/r02-n031", headers=scoped).status_code == 404  # another's node, as on the leader
        assert http.get("/health", headers=scoped).json()["role"] == "follower"  # its own health, not forwarded


def test_a_follower_refuses_a_write_without_a_valid_token_itself(tenants: list[Replica]) -> None:
    """401 from the follower, counted there, and the leader never asked (no request forwarded)."""
    lead, follower = started(tenants)
    forwarded = counter(follower, "forwarded_requests", "forwarded")
    refused_here = counter(follower, "requests_refused", "unauthenticated")
    refused_there = counter(lead, "requests_refused", "unauthenticated")
    with httpx.Client(base_url=f"{follower.base}/v1", timeout=10) as http:
        for headers, detail in (({}, "missing bearer token"), ({"Authorization": "Bearer nope"}, "invalid token"),
                                ({"Authorization": "Basic abc"}, "missing bearer token")):
            r = http.post("/events", content=b"{not json", headers={**headers, "content-type": "application/json"})
            assert r.status_code == 401, r.text
            assert r.headers["www-authenticate"] == "Bearer" and r.json()["detail"].startswith(detail)
        r = http.put("/mode", json={"dry_run": True}, headers={"Authorization": f"Bearer {ACME}x"})
        assert r.status_code == 401, r.text
        r = http.put("/mode", json={"dry_run": True}, headers={"Authorization": f"Bearer {ACME}"})
        assert r.status_code == 403, r.text  # a valid token: the leader decides what its role may do
    assert counter(follower, "forwarded_requests", "forwarded") == forwarded + 1  # the 403 only
    assert counter(follower, "requests_refused", "unauthenticated") == refused_here + 4
    assert counter(lead, "requests_refused", "unauthenticated") == refused_there


def test_a_followers_own_admission_answers_429_while_the_leader_is_slow(tmp_path: Path, pg_url: str) -> None:
    """``max_inflight_reports`` is per replica: a follower whose forwarded reports wait on a stalled leader
    refuses more with 429 + Retry-After itself. (A long lease: the follower must not take over meanwhile.)"""
    group = [Replica(tmp_path, name, pg_url, 30.0, 0.5, settings="[limits]\nmax_inflight_reports = 2\n")
             for name in ("a", "b")]
    try:
        lead, follower = started(group)
        url = f"{follower.base}/v1/nodes/r01-n001/heartbeat"
        beat = {"time": datetime.now(UTC).isoformat()}
        answers: list[int] = []
        lead.signal(signal.SIGSTOP)
        try:
            held = [threading.Thread(target=lambda: answers.append(
                httpx.post(url, json=beat, headers=HEADERS, timeout=60).status_code)) for _ in range(2)]
            for t in held:
                t.start()
            # Probe until the follower refuses: with the leader stopped, any answer at all comes from the
            # follower itself (a forwarded probe would wait on the leader: its short timeout moves on).
            refused, deadline = None, time.monotonic() + 60
            while refused is None and time.monotonic() < deadline:
                try:
                    probe = httpx.post(url, json=beat, headers=HEADERS, timeout=1.0)
                except httpx.TimeoutException:
                    continue  # not yet two in flight: this probe was forwarded and waits
                assert probe.status_code == 429, probe.text
                refused = probe
            assert refused is not None, "the follower never refused while the leader was stopped"
            assert refused.headers["retry-after"] == "1"
            assert "too many reports in flight" in refused.json()["detail"]
        finally:
            lead.signal(signal.SIGCONT)
        for t in held:
            t.join(60)
        # the held posts waited for the leader and were answered when it woke (either may instead have been
        # the one refused, if a probe was in flight before it arrived)
        assert len(answers) == 2 and set(answers) <= {200, 429} and 200 in answers, answers
        assert httpx.post(url, json=beat, headers=HEADERS, timeout=30).status_code == 200  # the cap frees up
        assert counter(follower, "requests_refused", "inflight") >= 1
    finally:
        for r in group:
            r.close()
