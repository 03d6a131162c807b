"""Crash safety of the repair ladder: SIGKILL a real ``gpufleet controller serve`` while a repair step
(a GPU reset queued for the node's agent) is in flight; the restarted controller resumes the same
step — the agent sees one command, never two — and the loop goes on to revalidation."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

ADMIN = "admin-token-repair-crash-0123"
AGENT = "agent-token-repair-crash-0123"
GPUFLEET = str(Path(sys.executable).with_name("gpufleet"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = check()
        except httpx.HTTPError:
            got = None
        if got:
            return got
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for: {what}", pytrace=False)


class Serve:
    def __init__(self, tmp: Path) -> None:
        self.tmp, self.port = tmp, _free_port()
        (tmp / "policy.toml").write_text('[policy]\nheartbeat_timeout = "0s"\ncheckpoint_poll = "0.2s"\n'
                                         '[breaker]\nmax_unavailable_fleet = 1.0\nmax_unavailable_domain = 1.0\n')
        (tmp / "controller.toml").write_text(
            f'database_url = "sqlite:///{tmp / "c.db"}"\nport = {self.port}\nscheduler = "sim"\n'
            f'reconcile_interval = 0.1\npolicy_file = "{tmp / "policy.toml"}"\n[repair]\nagent = true\n'
            f'[[tokens]]\nname = "admin"\nrole = "admin"\ntoken = "{ADMIN}"\n'
            f'[[tokens]]\nname = "agent"\nrole = "agent"\ntoken = "{AGENT}"\nnodes = ["*"]\n')
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        self.proc = subprocess.Popen([GPUFLEET, "controller", "serve", "--config", str(self.tmp / "controller.toml"),
                                      "--sim-nodes", "2", "--sim-state", str(self.tmp / "sched.json")],
                                     stdout=(self.tmp / "serve.log").open("a"), stderr=subprocess.STDOUT)
        wait_for(lambda: httpx.get(f"{self.url}/health", headers=_h(ADMIN)).status_code == 200, "controller up")

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    s = Serve(tmp_path)
    yield s
    s.kill9()


def test_sigkill_while_a_repair_step_is_in_flight_runs_it_once(serve: Serve) -> None:
    serve.start()
    node = httpx.get(f"{serve.url}/nodes", headers=_h(ADMIN)).json()[0]["id"]
    ev = {"id": "x48", "node": node, "kind": "xid", "code": 48, "time": datetime.now(UTC).isoformat(),
          "component": f"{node}-gpu0"}
    assert httpx.post(f"{serve.url}/events", json={"events": [ev]}, headers=_h(AGENT)).status_code == 202

    def queued() -> list[dict[str, Any]]:
        cmds: list[dict[str, Any]] = httpx.get(f"{serve.url}/nodes/{node}/commands", headers=_h(AGENT)).json()[
            "commands"]
        return cmds

    first = wait_for(queued, "a gpu_reset queued for the agent")
    assert [c["kind"] for c in first] == ["gpu_reset"]
    serve.kill9()  # mid-step: the command is queued, the controller is waiting for its result
    serve.start()
    wait_for(lambda: any(a["kind"] == "repair" and a["status"] == "waiting"
                         for a in httpx.get(f"{serve.url}/actions", params={"node": node}, headers=_h(ADMIN)).json()),
             "the restarted controller resumed the repair")
    assert [c["id"] for c in queued()] == [first[0]["id"]], "the same step, not a second one"
    r = httpx.post(f"{serve.url}/nodes/{node}/commands/{first[0]['id']}/result",
                   json={"ok": True, "detail": "simulated reset"}, headers=_h(AGENT))
    assert r.status_code == 200 and r.json()["status"] == "succeeded"
    wait_for(lambda: httpx.get(f"{serve.url}/nodes/{node}", headers=_h(ADMIN)).json()["node"]["state"]
             == "revalidate", "repair -> revalidate after the step worked")
    steps = [a for a in httpx.get(f"{serve.url}/audit", params={"target": node}, headers=_h(ADMIN)).json()
             if a["action"] == "repair_step"]
    assert len(steps) == 1, steps
