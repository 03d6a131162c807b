"""Crash safety: kill -9 the controller at random points during a burst of 1,000 events.

After every restart the controller must resume from the store and the outbox: no accepted event is
lost, no action is executed twice, and every node is in a legal state reached by legal transitions,
consistent with what the scheduler shows.
"""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from gpufleet.lifecycle.states import TRANSITIONS, UNAVAILABLE, NodeState
from tests.integration.crash.child import NODES, TOKEN
from tests.integration.forkserver import Forked, ForkServer

EVENTS = 1000
BATCH = 10
MIN_KILLS = 20
pytestmark = pytest.mark.slow


class Child:
    """The controller under test: a process forked per start by one fork server (tests/integration/forkserver.py:
    a real process and a real SIGKILL; the modules are imported once, not at each of the 20+ starts)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.server = ForkServer("tests.integration.crash.child", workdir / "forkserver.log")
        self.proc: Forked | None = None
        self.url = ""

    def start(self) -> None:
        (self.workdir / "port").unlink(missing_ok=True)
        self.proc = self.server.spawn([str(self.workdir)], self.workdir / "child.log")
        deadline = time.monotonic() + 60
        while not (self.workdir / "port").exists():
            assert self.proc.alive(), (self.workdir / "child.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "controller did not start within 60 s"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{(self.workdir / 'port').read_text()}/v1"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.kill9()

    def close(self) -> None:
        self.kill9()
        self.server.close()


def batches(rng: random.Random) -> Iterator[list[dict[str, object]]]:
    nodes = [f"r{i * 10 // NODES + 1:02d}-n{i + 1:03d}" for i in range(NODES)]
    kinds = [("xid", 13)] * 6 + [("ecc_sbe", None)] * 6 + [("xid", 79), ("xid", 48), ("xid", 94),
                                                            ("row_remap_pending", None), ("link_flap", None)]
    batch: list[dict[str, object]] = []
    for i in range(EVENTS):
        kind, code = rng.choice(kinds)
        batch.append({"id": f"burst-{i}", "node": rng.choice(nodes), "kind": kind, "code": code,
                      "time": datetime.now(UTC).isoformat(), "component": "gpu3"})
        if len(batch) == BATCH:
            yield batch
            batch = []


@pytest.fixture
def child(tmp_path: Path) -> Iterator[Child]:
    c = Child(tmp_path)
    try:
        yield c
    finally:
        c.close()


def test_kill_dash_nine_during_a_burst_loses_nothing_and_repeats_nothing(child: Child, tmp_path: Path) -> None:
    rng = random.Random(20261121)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    pending = list(batches(rng))
    accepted: set[str] = set()
    kills = 0
    child.start()
    while pending:
        # Each cycle: one batch is acknowledged first (so every restart makes progress), then a timer
        # kills the controller at a random moment while more batches are in flight — mid-request,
        # mid-commit or mid-reconcile.
        with httpx.Client(base_url=child.url, headers=headers, timeout=10) as http:
            timer: threading.Timer | None = None
            for i in range(rng.randint(2, 8)):
                if not pending:
                    break
                try:
                    r = http.post("/events", json={"events": pending[0]})
                except httpx.TransportError:
                    break  # not acknowledged: resent after the restart
                assert r.status_code == 202, r.text
                accepted.update(str(e["id"]) for e in pending.pop(0))
                if i == 0:
                    timer = threading.Timer(rng.uniform(0.0, 0.3), child.kill9)
                    timer.start()
            if timer is not None:
                timer.join()
        if child.proc is not None and not child.alive():
            kills += 1
        child.kill9()
        child.start()
    # Let the reconciler finish the outbox, then a last kill for good measure.
    with httpx.Client(base_url=child.url, headers=headers, timeout=10) as http:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            open_actions = [a for a in http.get("/actions", params={"limit": 1000}).json()
                            if a["status"] in ("pending", "waiting")]
            nodes = http.get("/nodes", params={"limit": 1000}).json()
            if not open_actions and not any(n["state"] == "draining" for n in nodes):
                break
            time.sleep(0.1)
        assert not open_actions, open_actions[:3]
    child.kill9()
    assert kills >= MIN_KILLS, f"only {kills} kills happened"

    db = sqlite3.connect(tmp_path / "gpufleet.db")
    stored = {r[0] for r in db.execute("select id from events")}
    lost = accepted - stored
    assert not lost, f"{len(lost)} accepted events lost, e.g. {sorted(lost)[:5]}"
    assert len(accepted) == EVENTS

    # No action executed twice: every scheduler effect is unique, and every drain names an applied decision.
    effects = [tuple(e) for e in json.loads((tmp_path / "scheduler.json").read_text())["effects"]]
    assert len(effects) == len(set(effects)), "an effect happened twice"
    drains = [e for e in effects if e[0] == "drain"]
    assert drains, "the burst should have drained some nodes"
    applied = {r[0] for r in db.execute("select id from decisions where status = 'applied'")}
    for _what, node, reason in drains:
        did = reason.removeprefix("gpufleet:").split(" ", 1)[0]
        assert did in applied, f"{node} drained for unknown decision {did}"
    done_drains = {r[0] for r in db.execute("select node from actions where kind in ('drain', "
                                            "'drain_after_checkpoint') and status = 'done'")}
    assert {n for _w, n, _r in drains} == done_drains

    # Every node is in a legal state, reached by a legal chain, and matches the scheduler.
    sched = {n[0]: n for n in json.loads((tmp_path / "scheduler.json").read_text())["nodes"]}
    for node, state in db.execute("select id, state from nodes"):
        chain = [(f, t) for f, t in db.execute(
            "select from_state, to_state from transitions where node = ? order by seq", (node,))]
        current = NodeState.READY
        for f, t in chain:
            assert NodeState(f) == current, f"{node}: transition from {f} but node was {current}"
            assert NodeState(t) in TRANSITIONS[NodeState(f)], f"{node}: illegal {f} -> {t}"
            current = NodeState(t)
        assert NodeState(state) == current
        drained_in_scheduler = sched[node][1]
        if NodeState(state) in UNAVAILABLE:
            assert drained_in_scheduler, f"{node} is {state} but not drained in the scheduler"
        if NodeState(state) in (NodeState.READY, NodeState.IN_SERVICE):
            assert not drained_in_scheduler, f"{node} is {state} but drained in the scheduler"
