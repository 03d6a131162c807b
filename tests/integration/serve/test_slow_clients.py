"""Slow clients against the real controller (uvicorn): half-sent requests are cut off at the header
deadline with a 408, counted and logged; complete requests, slow or on a reused connection, are served.

Issue #16: 1,000 connections that sent half a request were all still held after 30 s.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from gpufleet.controller.runtime import Runtime, build
from gpufleet.controller.settings import ControllerSettings, LimitSettings, Role, SchedulerKind, TokenConfig
from gpufleet.domain.fleet import Node
from gpufleet.lifecycle.states import NodeState
from gpufleet.schedulers.sim import SimScheduler
from tests.integration.agent.harness import wait_for

TOKEN = "slow-clients-viewer-token-01"
DEADLINE_S = 0.5


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, int]]:
    settings = ControllerSettings(database_url=f"sqlite:///{tmp_path / 'c.db'}", host="127.0.0.1", port=0,
                                  scheduler=SchedulerKind.SIM, limits=LimitSettings(header_timeout_s=DEADLINE_S),
                                  tokens=(TokenConfig(name="vera", role=Role.VIEWER, token=TOKEN),))
    rt: Runtime = build(settings, SimScheduler([]))
    ports: list[int] = []
    rt.start_api(in_thread=True, on_started=ports.append)
    try:
        yield "127.0.0.1", ports[0]
    finally:
        rt.shutdown()


def _until_closed(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a blocking read, bounded)."""
    s.settimeout(30)
    got = b""
    while chunk := s.recv(4096):
        got += chunk
    return got


def _status(host: str, port: int) -> dict[str, int]:
    r = httpx.get(f"http://{host}:{port}/v1/status", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert r.status_code == 200
    return dict(r.json()["refused"])


def test_half_sent_requests_are_cut_off_with_a_408_and_counted(
        server: tuple[str, int], caplog: pytest.LogCaptureFixture) -> None:
    host, port = server
    caplog.set_level(logging.WARNING, "gpufleet.controller.api.slowclients")
    partial = [b"", b"GET /v1/hea", b"GET /v1/health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "]
    socks = []
    for i in range(60):
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(partial[i % len(partial)])
        socks.append(s)
    answers = [_until_closed(s) for s in socks]
    for s in socks:
        s.close()
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), {a[:40] for a in answers}
    assert _status(host, port)["header_timeout"] == 60
    metrics = httpx.get(f"http://{host}:{port}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert 'gpufleet_requests_refused_total{reason="header_timeout"} 60.0' in metrics.text
    assert "request headers not complete within" in caplog.text


def test_complete_requests_are_served_slow_ones_and_on_a_reused_connection(server: tuple[str, int]) -> None:
    host, port = server
    with socket.create_connection((host, port), timeout=10) as s:
        request = f"GET /v1/health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
        for piece in (request[:10], request[10:30], request[30:]):  # in pieces, well within the deadline
            s.sendall(piece)
        s.settimeout(10)
        first = s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        # the same connection, a second request: the deadline starts again for it and is met
        s.sendall(request)
        second = s.recv(65536)
        assert second.startswith(b"HTTP/1.1 200 ")
    assert _status(host, port).get("header_timeout", 0) == 0


def test_a_header_deadline_must_be_a_duration() -> None:
    with pytest.raises(ValueError, match="header_timeout_s"):
        LimitSettings(header_timeout_s=0)


def test_past_the_in_flight_cap_reports_are_refused_before_their_body_and_others_are_not(
        tmp_path: Path) -> None:
    agent = "slow-clients-agent-token-001"
    settings = ControllerSettings(
        database_url=f"sqlite:///{tmp_path / 'c.db'}", host="127.0.0.1", port=0, scheduler=SchedulerKind.SIM,
        limits=LimitSettings(max_inflight_reports=1),
        tokens=(TokenConfig(name="vera", role=Role.VIEWER, token=TOKEN),
                TokenConfig(name="agent", role=Role.AGENT, token=agent, nodes=("r01-n01",))))
    rt: Runtime = build(settings, SimScheduler(["r01-n01"]))
    rt.controller.register([Node("r01-n01", "r01")], state=NodeState.READY)
    ports: list[int] = []
    rt.start_api(in_thread=True, on_started=ports.append)
    base, auth = f"http://127.0.0.1:{ports[0]}", {"Authorization": f"Bearer {agent}"}

    def report(eid: str) -> dict[str, object]:
        return {"events": [{"id": eid, "node": "r01-n01", "kind": "ecc_sbe", "time": datetime.now(UTC).isoformat()}]}

    body = json.dumps(report("slow")).encode()
    try:
        with socket.create_connection(("127.0.0.1", ports[0]), timeout=10) as slow:
            # one report in flight: its headers are in, its body is still coming
            slow.sendall(f"POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {agent}\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                         + body[:10])
            refused: list[httpx.Response] = []
            wait_for(lambda: refused.append(r := httpx.post(f"{base}/v1/events", json=report(f"e{len(refused)}"),
                                                          headers=auth, timeout=10)) or r.status_code == 429,
                     "a report refused while another is in flight")
            viewer = httpx.get(f"{base}/v1/health", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
            reused = _refused_then_reused(ports[0], agent, json.dumps(report("raw")).encode())
            slow.sendall(body[10:])
            answer = _until_first_line(slow)
        status = _status("127.0.0.1", ports[0])
    finally:
        rt.shutdown()
    second = refused[-1]
    assert second.status_code == 429 and second.headers["retry-after"] == "1"
    assert "too many reports in flight" in second.json()["detail"]
    assert viewer.status_code == 200  # only agents' reports are refused by the cap
    assert answer.startswith(b"HTTP/1.1 202 ")  # the report in flight is served
    # a refused report with a declared body keeps its connection: the next request on it is served
    # (its body was skipped, not parsed as the next request); a chunked one is refused and closed
    (kept_head, next_head, next_body), (chunked_head, closed_after) = reused
    assert kept_head.startswith(b"HTTP/1.1 429 ") and b"connection: close" not in kept_head.lower()
    assert next_head.startswith(b"HTTP/1.1 200 ") and json.loads(next_body)
    assert chunked_head.startswith(b"HTTP/1.1 429 ") and b"connection: close" in chunked_head.lower()
    assert closed_after == b""
    assert status["inflight"] == 1 + 2


def _until_first_line(s: socket.socket) -> bytes:
    got = b""
    while b"\r\n" not in got:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    return got


def _response(s: socket.socket) -> tuple[bytes, bytes]:
    """One HTTP response with a Content-Length body: (status line and headers, body)."""
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(4096)
        assert chunk, f"connection closed mid-response: {got!r}"
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = s.recv(4096)
        assert chunk, "connection closed mid-body"
        body += chunk
    return head, body


def _refused_then_reused(port: int, agent: str, body: bytes
                         ) -> tuple[tuple[bytes, bytes, bytes], tuple[bytes, bytes]]:
    """While the cap is full: a report with a Content-Length, then a viewer's GET on the same socket;
    and a chunked report on another socket, then whatever follows its answer (b"" once closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {agent}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        kept_head, _ = _response(s)
        s.sendall(f"GET /v1/health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
        next_head, next_body = _response(s)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {agent}\r\n"
                  f"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
                  + b"%x\r\n" % len(body) + body + b"\r\n")
        chunked_head, _ = _response(s)
        closed_after = _until_closed(s)
    return (kept_head, next_head, next_body), (chunked_head, closed_after)
