"""Chaos: the database goes away in the middle of a burst of agents' posts and operator actions, then
comes back (issue #16). Afterwards memory equals the database, no event that was answered 202 is lost,
and no scheduler action ran twice.

PostgreSQL: a throwaway cluster of this test's own (scripts/pg-lab.sh) is stopped with ``pg_ctl stop -m
fast`` while six agents post and an operator drains a node, and started again. SQLite: another
process takes the database file's write lock (``BEGIN EXCLUSIVE``, as a backup tool or a stray
``sqlite3`` shell would) for the same stretch — the file cannot be written, though it can be read. The
controller is the real runtime (uvicorn on a port, the reconciler thread, the simulated scheduler), the
agents and the operator real HTTP clients that retry until answered, as the real agent does. The outage
is logged per kind of failure, with a count and a line when it is over, not per refused post or pass.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from gpufleet.controller.runtime import Runtime, build
from gpufleet.controller.settings import ControllerSettings, Role, SchedulerKind, TokenConfig
from gpufleet.controller.store.models import ActionRow, EventRow, NodeRow
from gpufleet.domain.fleet import Fleet, Node
from gpufleet.lifecycle.config import parse_policy
from gpufleet.lifecycle.states import NodeState
from gpufleet.schedulers.sim import SimScheduler
from tests.integration.agent.harness import wait_for
from tests.integration.pglab import pg_lab

ROOT = Path(__file__).resolve().parents[3]
AGENT, OPERATOR = "chaos-agent-token-000000001", "chaos-operator-token-0000001"
AGENTS, NODES_EACH, BATCHES, PER_BATCH = 6, 4, 30, 5
NODES = [f"r{a + 1:02d}-n{i + 1:02d}" for a in range(AGENTS) for i in range(NODES_EACH)]
OPERATED = NODES[-1]  # drained by the operator; the agents' fatal faults hit each rack's first node


@dataclass
class Tally:
    """What the clients saw: the events answered 202, the answers that were not, operator calls."""

    accepted: set[tuple[str, str]] = field(default_factory=set)
    failed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    operator: list[str] = field(default_factory=list)


def _event(node: str, k: int, fatal: bool) -> dict[str, object]:
    now = datetime.now(UTC).isoformat()
    if fatal:
        return {"id": f"{node}:x79:{k}", "node": node, "kind": "xid", "code": 79, "time": now,
                "component": f"{node}-gpu0", "message": "GPU has fallen off the bus"}
    return {"id": f"{node}:sbe:{k}", "node": node, "kind": "ecc_sbe", "time": now, "component": f"{node}-gpu1",
            "message": "corrected ECC error"}


def _retrying(tally: Tally, stop: threading.Event, call: Callable[[], httpx.Response], ok: set[int]) -> int:
    """Send until answered with a status in ``ok`` (the agent's own loop: a 503 or a refused connection
    is tried again); returns that status."""
    for _ in range(2000):
        try:
            r = call()
        except httpx.HTTPError:
            r = None
        if r is not None and r.status_code in ok:
            return r.status_code
        with tally.lock:
            tally.failed += 1
        stop.wait(0.05)  # back off a little, as the agent does (its backoff is longer)
    raise AssertionError("never answered")


def _agent(base: str, nodes: list[str], tally: Tally, stop: threading.Event, outage: threading.Event) -> None:
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {AGENT}"}, timeout=30) as http:
        for b in range(BATCHES):
            if b == BATCHES // 3:  # the rest of the burst goes out once the outage is in effect: "mid burst"
                outage.wait(180)  # however fast ingest got (it once finished before the lock was taken)
            events = [_event(n, b * PER_BATCH + j, fatal=(b == BATCHES // 2 and n == nodes[0] and j == 0))
                      for j in range(PER_BATCH) for n in nodes[j % len(nodes):j % len(nodes) + 1]]
            _retrying(tally, stop, lambda ev=events: http.post("/v1/events", json={"events": ev}), {202})
            with tally.lock:
                tally.accepted.update((str(e["node"]), str(e["id"])) for e in events)


def _state(http: httpx.Client, tally: Tally, stop: threading.Event) -> str:
    for _ in range(2000):
        try:
            r = http.get(f"/v1/nodes/{OPERATED}")
            if r.status_code == 200:
                return str(r.json()["node"]["state"])
        except httpx.HTTPError:
            pass
        stop.wait(0.05)
    raise AssertionError("node never read")


def _operator(base: str, tally: Tally, stop: threading.Event) -> None:
    """Drain a node and wait until it is drained, as a person at the CLI would; then drain it again (a
    repeated command must not drain twice)."""
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {OPERATOR}"}, timeout=30) as http:
        for op, then in (("drain", "drained"), ("drain", "drained")):
            # 409 (already there): the previous try's answer was lost, but it was carried out
            status = _retrying(tally, stop, lambda op=op: http.post(f"/v1/nodes/{OPERATED}/{op}",
                                                                     json={"reason": "chaos"}), {200, 409})
            state = ""
            for _ in range(1200):
                state = _state(http, tally, stop)
                if state == then:
                    break
                stop.wait(0.05)
            tally.operator.append(f"{op}:{status}:{state}")


class Outage:
    """Starts and ends the database outage (PostgreSQL stopped, or the SQLite file's write lock held)."""

    def __init__(self, begin: Callable[[], None], end: Callable[[], None]) -> None:
        self.begin, self.end = begin, end


@dataclass
class Backend:
    url: str
    outage: Outage
    refusals: int  # refused posts before the outage ends (SQLite: each waits out the 30 s busy timeout first)
    server_fails: bool  # the controller's writes fail in the outage (not only the clients' waits: SQLite)


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "sqlite":
        path = Path(tempfile.mkdtemp(prefix="gpufleet-chaos-")) / "c.db"
        holder: list[sqlite3.Connection] = []

        def lock() -> None:
            conn = sqlite3.connect(path, timeout=30, isolation_level=None)
            conn.execute("BEGIN EXCLUSIVE")
            holder.append(conn)

        def unlock() -> None:
            conn = holder.pop()
            conn.execute("ROLLBACK")
            conn.close()

        yield Backend(f"sqlite:///{path}", Outage(lock, unlock), 5, server_fails=False)
        shutil.rmtree(path.parent, ignore_errors=True)
        return
    with pg_lab() as db:
        yield Backend(db.url, Outage(db.down, db.up), 300, server_fails=True)


def test_a_database_outage_mid_burst_loses_nothing_and_runs_nothing_twice(
        backend: Backend, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpufleet")
    settings = ControllerSettings(
        database_url=backend.url, host="127.0.0.1", port=0, scheduler=SchedulerKind.SIM, reconcile_interval=0.2,
        tokens=(TokenConfig(name="agents", role=Role.AGENT, token=AGENT, nodes=("*",)),
                TokenConfig(name="ops", role=Role.OPERATOR, token=OPERATOR)))
    policy = parse_policy({"policy": {"auto_repair": False},  # drained nodes stay drained: nothing else queued
                           "breaker": {"max_unavailable_fleet": 1.0, "max_unavailable_domain": 1.0}})
    sched = SimScheduler(NODES)
    rt: Runtime = build(settings, sched, policy=policy)
    rt.controller.register_fleet(Fleet.of([Node(id=n, rack=n[:3]) for n in NODES]))
    ports: list[int] = []
    rt.start_api(in_thread=True, on_started=ports.append)
    rt.start_reconciler(0.2)
    base = f"http://127.0.0.1:{ports[0]}"
    tally, stop = Tally(), threading.Event()
    errors: list[BaseException] = []

    def run(fn: Callable[..., None], *args: object) -> threading.Thread:
        def target() -> None:
            try:
                fn(*args)
            except BaseException as err:  # surfaced below
                errors.append(err)
        return threading.Thread(target=target)

    outage = threading.Event()
    threads = [run(_agent, base, NODES[a * NODES_EACH:(a + 1) * NODES_EACH], tally, stop, outage)
               for a in range(AGENTS)]
    threads.append(run(_operator, base, tally, stop))
    try:
        for t in threads:
            t.start()
        total = AGENTS * NODES_EACH * BATCHES * PER_BATCH // NODES_EACH
        wait_for(lambda: len(tally.accepted) >= total // 4, "a quarter of the burst accepted")
        backend.outage.begin()
        outage.set()
        # refused posts (SQLite: each waits out the 30 s busy timeout first)
        wait_for(lambda: tally.failed >= backend.refusals, "posts refused while the database is away", timeout_s=120)
        backend.outage.end()
        for t in threads:
            t.join(timeout=300)
            assert not t.is_alive()
        assert not errors, errors
        assert len(tally.accepted) == total
        # the reconciler carries out every action the decisions queued
        store = rt.controller.store
        wait_for(lambda: not store.actions(status="pending") and not store.actions(status="waiting"),
                 "every queued action carried out", timeout_s=60)
        # Memory and the database read together, under the lock every write of the controller holds: read
        # one after the other, a reconciler pass between them (draining -> drained) told them apart.
        with rt.controller.lock:
            memory = {n: rec.state.value for n, rec in rt.controller.engine.nodes.items()}
            with store.session() as s:
                stored = {(r.node, r.id) for r in s.scalars(select(EventRow))}
                db_states = {r.id: r.state for r in s.scalars(select(NodeRow))}
                actions = [(r.kind, r.node, r.status) for r in s.scalars(select(ActionRow))]
    finally:
        stop.set()
        rt.shutdown()
    # Logged per kind of failure, not per refused post or failed pass: 874 records for the ~300 posts refused
    # in a 3 s PostgreSQL outage before (each with its SQL), ~900 lines of tracebacks in a 30 s drill.
    logged = [r for r in caplog.records if r.name.startswith("gpufleet.controller") and r.levelno >= logging.WARNING]
    said = [r.getMessage() for r in logged]
    assert tally.failed >= backend.refusals and len(logged) <= 30, said
    failed = [m for m in said if m.startswith("writing to the database failed (")]  # the failure itself, in full
    again = [m for m in said if m.startswith("writing to the database: working again after ")]  # and its end
    if backend.server_fails:
        assert failed and again, said
    else:  # SQLite: the client's 30 s timeout may come before the server's busy timeout, whose write then succeeds
        assert bool(failed) == bool(again), said
    assert [c.split(":", 1)[0] + ":" + c.rsplit(":", 1)[1] for c in tally.operator] == [
        "drain:drained", "drain:drained"], tally.operator
    assert tally.accepted <= stored, f"{len(tally.accepted - stored)} accepted events lost"
    assert memory == db_states
    fatal_nodes = {NODES[a * NODES_EACH] for a in range(AGENTS)}
    assert {n for n, st in memory.items() if st in (NodeState.DRAINING, NodeState.DRAINED)} == fatal_nodes | {OPERATED}
    # no action twice: the scheduler was asked to drain each node exactly as many times as a drain action exists
    drains = Counter(target for what, target, _ in sched.effects if what == "drain")
    planned = Counter(node for kind, node, status in actions if kind == "drain")
    assert drains == planned, (drains, planned)
    assert all(status == "done" for _, _, status in actions), actions
    assert planned == Counter(dict.fromkeys(fatal_nodes | {OPERATED}, 1))
