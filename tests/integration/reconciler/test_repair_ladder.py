"""Repair executors and the escalation ladder, end to end inside the controller: real store (SQLite),
real agent command queue, real ticket webhook (a small HTTP server on 127.0.0.1), simulated scheduler
and clock. The node's agent is played by answering its commands through the command queue, exactly
as ``POST /v1/nodes/{node}/commands/{id}/result`` does (the HTTP route is tested in tests/integration/api)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.executors.agent import AgentExecutor
from gpufleet.controller.executors.ticket import TicketExecutor
from gpufleet.controller.reconciler import Reconciler
from gpufleet.controller.repairer import Repairer
from gpufleet.controller.service import Controller
from gpufleet.controller.store.db import make_engine, migrate
from gpufleet.controller.store.models import ActionRow
from gpufleet.controller.store.repairs import RepairStore
from gpufleet.controller.store.repo import Page, Store
from gpufleet.domain.errors import Conflict
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.fleet import simulated_fleet
from gpufleet.lifecycle.config import parse_policy
from gpufleet.schedulers.sim import SimScheduler

T0 = datetime(2026, 11, 21, 12, tzinfo=UTC)
POLICY = {"breaker": {"max_unavailable_fleet": 1.0, "max_unavailable_domain": 1.0},
          "policy": {"heartbeat_timeout": "0s", "checkpoint_poll": "5s"},
          "repair": {"step_timeout": "10m"}}


class Tickets:
    """A real webhook receiver: every POST body is kept; answers ``status``."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.keys: list[str] = []
        self.status = 201
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                outer.keys.append(self.headers.get("Idempotency-Key", ""))
                self.send_response(outer.status)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/tickets"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def tickets() -> Iterator[Tickets]:
    t = Tickets()
    yield t
    t.server.shutdown()


class World:
    def __init__(self, tmp: Path, tickets: Tickets) -> None:
        self.url = f"sqlite:///{tmp / 'g.db'}"
        self.clock = ManualClock(T0)
        self.tickets = tickets
        fleet = simulated_fleet(4, 1)
        self.ids = [n.id for n in fleet]
        self.s = SimScheduler(self.ids)
        self.restart()
        self.c.register_fleet(fleet)

    def restart(self) -> None:
        """New controller, reconciler and executors on the same database (a restarted process)."""
        engine = make_engine(self.url)
        migrate(engine)
        self.c = Controller(Store(engine), parse_policy(POLICY), self.clock)
        self.repairs = RepairStore(self.c.store)
        executors = {"agent": AgentExecutor(self.repairs, self.clock), "ticket": TicketExecutor(self.tickets.url)}
        self.r = Reconciler(self.c, self.s, repairer=Repairer(self.c, executors))

    def step(self, seconds: float = 6) -> None:
        self.clock.advance(timedelta(seconds=seconds))
        self.r.run_once()

    def event(self, node: str, kind: EventKind, code: int | None = None) -> None:
        n = len(self.c.store.events(node=node, page=Page(1000)))
        self.c.ingest([HealthEvent(f"{node}-{kind}-{n}", node, kind, self.clock.now(), f"{node}-gpu0", code)])

    def state(self, node: str) -> str:
        return str(self.c.state_of(node))

    def agent_answers(self, node: str, ok: bool, detail: str = "done") -> list[str]:
        """The node's agent runs what is queued for it and reports (as the HTTP route does)."""
        done = []
        for cmd in self.repairs.pending(node):
            self.repairs.finish(node, cmd.id, ok, f"{cmd.kind} {detail}", self.clock.now())
            done.append(cmd.kind)
        return done

    def repair_actions(self, node: str) -> list[ActionRow]:
        return [a for a in self.c.store.actions(node=node, page=Page(100)) if a.kind == "repair"]

    def audit(self, node: str, what: str) -> list[str]:
        return [a.detail for a in self.c.store.audit(target=node, page=Page(500)) if a.action == what][::-1]

    def take_out(self, node: str, code: int) -> None:
        """A fatal XID on an idle node: drained, handed to repair, first rung queued."""
        self.event(node, EventKind.XID, code)
        for _ in range(3):
            self.step()
        assert self.state(node) == "repair"


def test_a_gpu_reset_that_works_returns_the_node_through_revalidation(tmp_path: Path, tickets: Tickets) -> None:
    w = World(tmp_path, tickets)
    n = w.ids[0]
    w.take_out(n, 48)  # ROBUST_CHANNEL_GPU_ECC_DBE: the catalog says reset_gpu
    assert [c.kind for c in w.repairs.pending(n)] == ["gpu_reset"]
    assert w.audit(n, "repair_step")[0].startswith("gpu_reset (")
    w.restart()  # a controller restarted mid-step resumes it: no second command
    w.step()
    assert len(w.repairs.pending(n)) == 1 and w.repair_actions(n)[0].status == "waiting"
    assert w.agent_answers(n, ok=True) == ["gpu_reset"]
    w.step()
    assert w.state(n) == "revalidate"
    a = w.repair_actions(n)[0]
    assert a.status == "done" and a.result.startswith("gpu_reset succeeded"), a.result
    validate = next(x for x in w.c.store.actions(node=n, page=Page(100)) if x.kind == "validate")
    assert validate.level == "quick"  # after a reset; a reboot gets a full check
    w.event(n, EventKind.CHECK_PASSED)  # what the validation job posts
    w.step()
    assert w.state(n) == "ready" and not w.s.node(n).reason, "resumed with no operator call"
    assert tickets.bodies == []
    assert [(a.step, a.ok) for a in w.repairs.history(n, T0)] == [("gpu_reset", True)]


def test_a_fault_that_returns_after_two_reboots_goes_to_a_hardware_ticket(tmp_path: Path, tickets: Tickets) -> None:
    w = World(tmp_path, tickets)
    n = w.ids[1]
    w.take_out(n, 79)  # fell off the bus: the catalog says reboot
    for i in range(2):
        assert w.agent_answers(n, ok=True) == ["reboot"], f"reboot #{i + 1}"
        w.step()
        assert w.state(n) == "revalidate"
        assert next(x for x in w.c.store.actions(node=n, page=Page(100)) if x.kind == "validate").level == "full"
        w.event(n, EventKind.CHECK_FAILED)  # the fault is back: validation fails
        w.step()
        w.step()
        assert w.state(n) == "repair"
    assert w.repairs.pending(n) == [] and len(tickets.bodies) == 1
    body = tickets.bodies[0]
    assert body["format"] == "gpufleet.ticket/v1" and body["node"] == n and body["kind"] == "hardware"
    assert body["fault"]["key"] == "xid:79" and body["fault"]["action"] == "reboot"
    assert body["reason"].startswith("xid:79 came back after 2 reboots within 7d")
    assert [h["step"] for h in body["history"]] == ["reboot", "reboot"]
    assert tickets.keys == [body["id"]]
    last = w.repair_actions(n)[0]
    assert last.status == "done" and last.result.startswith("hardware ticket"), last.result
    for _ in range(3):
        w.step(600)
    assert w.state(n) == "repair" and len(tickets.bodies) == 1, "a ticket ends automation: filed once"


def test_a_failed_reset_climbs_to_a_reboot(tmp_path: Path, tickets: Tickets) -> None:
    w = World(tmp_path, tickets)
    n = w.ids[2]
    w.take_out(n, 48)
    assert w.agent_answers(n, ok=False, detail="refused: pid 4242 holds the GPU") == ["gpu_reset"]
    w.step()
    w.step()
    assert [c.kind for c in w.repairs.pending(n)] == ["reboot"]
    assert any("gpu_reset" in d and "failed: gpu_reset refused" in d for d in w.audit(n, "repair_result"))


def test_a_step_without_result_in_time_is_abandoned_and_its_late_result_refused(
        tmp_path: Path, tickets: Tickets) -> None:
    w = World(tmp_path, tickets)
    n = w.ids[3]
    w.take_out(n, 48)
    (cmd,) = w.repairs.pending(n)
    w.step(11 * 60)  # past step_timeout (10 min)
    w.step()
    assert [c.kind for c in w.repairs.pending(n)] == ["reboot"], "the next rung after the timeout"
    with pytest.raises(Conflict, match="expired"):
        w.repairs.finish(n, cmd.id, True, "late", w.clock.now())
    assert any("no result within 0:10:00" in d for d in w.audit(n, "repair_result"))


def test_a_lemon_node_is_recommended_for_retirement(tmp_path: Path, tickets: Tickets) -> None:
    w = World(tmp_path, tickets)
    n = w.ids[0]
    for day, code in enumerate((48, 62, 119, 120)):
        w.clock.advance(T0 + timedelta(days=day) - w.clock.now())
        w.take_out(n, code)
        assert w.agent_answers(n, ok=True) == ["gpu_reset"]
        w.step()
        w.event(n, EventKind.CHECK_PASSED)
        w.step()
        assert w.state(n) == "ready"
    w.clock.advance(T0 + timedelta(days=5) - w.clock.now())
    w.take_out(n, 48)
    assert w.repairs.pending(n) == [] and len(tickets.bodies) == 1
    assert tickets.bodies[0]["kind"] == "retire"
    assert w.audit(n, "lemon_node")[0].startswith("lemon node: 4 repairs within 30d")
