"""Two ``gpufleet controller serve`` processes (the CLI, as deployed) on one PostgreSQL: one leads, the
other follows and forwards; the simulated fleet is registered once, by the leader."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from tests.integration.ha.replicas import ROOT

pytestmark = [pytest.mark.ha, pytest.mark.postgres]
TOKEN = "serve-replicas-token-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.terminate()
        p.wait(timeout=30)


def test_two_serve_processes_elect_one_leader_and_the_follower_forwards(
        tmp_path: Path, pg_url: str, procs: list[subprocess.Popen[bytes]]) -> None:
    ports = [free_port(), free_port()]
    for i, port in enumerate(ports):
        config = tmp_path / f"c{i}.toml"
        config.write_text(f'database_url = "{pg_url}"\nscheduler = "sim"\nport = {port}\n'
                          f'[ha]\nlease_s = 2\nrenew_s = 0.5\n'
                          f'[[tokens]]\nname = "admin"\nrole = "admin"\ntoken = "{TOKEN}"\n', encoding="utf-8")
        log = (tmp_path / f"c{i}.log").open("wb")
        procs.append(subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "controller", "serve", "--config",
                                       str(config), "--sim-nodes", "8"], cwd=ROOT, stdout=log, stderr=log,
                                      env={**os.environ, "GPUFLEET_SCHEDULER": "sim"}))
    bases = [f"http://127.0.0.1:{p}/v1" for p in ports]
    headers = {"Authorization": f"Bearer {TOKEN}"}
    deadline = time.monotonic() + 90
    while True:
        roles = {}
        for base in bases:
            try:
                h = httpx.get(f"{base}/health", headers=headers, timeout=2).json()
                roles[base] = (h["role"], h["leader_url"])
            except (httpx.TransportError, ValueError):
                pass
        leaders = [b for b, (role, _) in roles.items() if role == "leader"]
        if len(roles) == 2 and len(leaders) == 1 and all(url for _, url in roles.values()):
            break
        assert time.monotonic() < deadline, f"{roles}: {(tmp_path / 'c1.log').read_text()[-1500:]}"
        time.sleep(0.1)
    [lead] = leaders
    [follower] = [b for b in bases if b != lead]
    assert roles[follower][1] + "/v1" == lead
    nodes = httpx.get(f"{follower}/nodes", headers=headers, timeout=5).json()
    assert len(nodes) == 8, "the simulated fleet is registered once, by the leader"
    event = {"id": "e1", "node": nodes[0]["id"], "kind": "xid", "code": 79, "time": datetime.now(UTC).isoformat()}
    r = httpx.post(f"{follower}/events", json={"events": [event]}, headers=headers, timeout=10)
    assert r.status_code == 202, r.text
    assert [e["id"] for e in httpx.get(f"{lead}/events", headers=headers, timeout=5).json()] == ["e1"]
