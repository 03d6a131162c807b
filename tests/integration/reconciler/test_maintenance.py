"""Maintenance rollouts inside the controller: real store, real lifecycle engine, reconciler and agent
command queue, the simulated scheduler and a manual clock. The node's agent is played by answering its
commands through the command queue, exactly as ``POST /v1/nodes/{node}/commands/{id}/result`` does;
the validation job by posting the check event it would post. (On the real Slurm lab with real agents:
tests/integration/slurm/test_maintenance_real.py.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.maintenance import Maintenance
from gpufleet.controller.reconciler import Reconciler
from gpufleet.controller.service import Controller
from gpufleet.controller.store.db import make_engine, migrate
from gpufleet.controller.store.repairs import RepairStore
from gpufleet.controller.store.repo import Page, Store
from gpufleet.domain.errors import Conflict, ExternalError, InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.fleet import simulated_fleet
from gpufleet.lifecycle.config import parse_policy
from gpufleet.schedulers.port import SchedNodeState
from gpufleet.schedulers.sim import SimScheduler

T0 = datetime(2026, 11, 26, 12, tzinfo=UTC)
POLICY = {"breaker": {"max_unavailable_fleet": 1.0, "max_unavailable_domain": 1.0},
          "policy": {"heartbeat_timeout": "0s", "checkpoint_poll": "1s", "auto_repair": True}}


class World:
    def __init__(self, url: str, nodes: int = 6, racks: int = 2) -> None:
        self.url = url
        self.clock = ManualClock(T0)
        fleet = simulated_fleet(nodes, racks)
        self.ids = [n.id for n in fleet]
        self.s = SimScheduler(self.ids)
        self.restart()
        self.c.register_fleet(fleet)
        self.ran: list[tuple[str, str]] = []  # (node, command id) the agents ran
        self.max_out = 0

    def restart(self) -> None:
        """New controller, runner and reconciler on the same database (a restarted process)."""
        engine = make_engine(self.url)
        migrate(engine)
        self.c = Controller(Store(engine), parse_policy(POLICY), self.clock)
        self.m = Maintenance(self.c, self.s)
        self.m.load()
        self.r = Reconciler(self.c, self.s, maintenance=self.m)
        self.repairs = RepairStore(self.c.store)

    def step(self, seconds: float = 2) -> None:
        self.clock.advance(timedelta(seconds=seconds))
        self.r.run_once()
        serving = (SchedNodeState.IDLE, SchedNodeState.ALLOCATED)
        try:
            sched_out = {n.name for n in self.s.list_nodes() if n.state not in serving}
        except ExternalError:  # (a test's simulated outage)
            sched_out = set()
        self.max_out = max(self.max_out, len(sched_out | self.c.engine.unavailable()))

    def agents(self, fail: frozenset[str] = frozenset()) -> list[str]:
        """Every node's agent runs what is queued for it (the nodes in ``fail``: the action fails)."""
        done = []
        for n in self.ids:
            for cmd in self.repairs.pending(n):
                self.ran.append((n, cmd.id))
                ok = n not in fail
                self.repairs.finish(n, cmd.id, ok, f"{cmd.kind} {'ok' if ok else 'exit 1'}", self.clock.now())
                done.append(n)
        return done

    def validations(self, verdict: EventKind = EventKind.CHECK_PASSED) -> None:
        """What a validation job posts for each node that is revalidating."""
        for n in self.ids:
            if self.c.state_of(n) == "revalidate":
                self.c.ingest([HealthEvent(f"check-{n}-{self.clock.now().isoformat()}", n, verdict, self.clock.now(),
                                           source="check", attrs=(("check", "gemm_bf16"),))])

    def run(self, rid: str, passes: int = 60, fail: frozenset[str] = frozenset()) -> str:
        for _ in range(passes):
            self.step()
            self.agents(fail)
            self.validations()
            state = self.m.store.get(rid).state
            if state in ("done", "stopped", "aborted"):
                return state
        return self.m.store.get(rid).state

    def steps(self, rid: str) -> dict[str, str]:
        return {n.node: n.step.value for n in self.m.store.get(rid).nodes}

    def audit(self, target: str) -> list[tuple[str, str]]:
        return [(a.action, a.detail) for a in self.c.store.audit(target=target, page=Page(1000))][::-1]


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(f"sqlite:///{tmp_path / 'g.db'}")


def test_a_rollout_goes_in_batches_counts_nodes_already_out_and_asks_the_job_to_checkpoint_first(
        world: World) -> None:
    w = world
    broken = w.ids[5]
    w.c.ingest([HealthEvent("x79", broken, EventKind.XID, w.clock.now(), component=f"{broken}-gpu0", code=79)])
    w.step()
    w.step()
    assert w.c.state_of(broken) in ("drained", "repair")  # out for another reason: it counts
    job = w.s.submit("train", [w.ids[0]], start=w.clock.now(), checkpoint_signal="USR1")
    w.step()
    rid = w.m.plan({"selector": "all", "action": "reboot", "max_unavailable": 2, "max_unavailable_domain": 2},
                   "operator:alice").id
    w.m.start(rid, "operator:alice")
    w.step()  # admitted: the drain-after-checkpoint decision
    w.step()  # carried out: the request
    assert w.s.checkpoint_requests(job.id) == 1, "the job is asked before its node drains"
    assert ("drain", w.ids[0]) not in [(e[0], e[1]) for e in w.s.effects]
    w.s.checkpoint(job.id, w.clock.now() + timedelta(seconds=1))  # it saves and reports
    assert w.run(rid) == "done"
    steps = w.steps(rid)
    assert steps.pop(broken) == "skipped" and set(steps.values()) == {"done"}
    assert w.max_out == 2, "the node in repair plus one rollout node at a time"
    assert sorted(n for n, _ in w.ran) == sorted(steps), "each action run once"
    effects = [(e[0], e[1]) for e in w.s.effects]
    assert effects.index(("checkpoint_request", job.id)) < effects.index(("drain", w.ids[0]))
    assert w.s._job(job.id).restarts == 1, "requeued from its checkpoint"
    assert all(w.c.state_of(n) == "ready" and not w.s.node(n).reason for n in steps)
    node_audit = [a for a, _ in w.audit(w.ids[1]) if a.startswith("maintenance_")]
    assert node_audit == ["maintenance_draining", "maintenance_action", "maintenance_validating", "maintenance_done"]
    assert [a for a, _ in w.audit(rid)] == ["maintenance_plan", "maintenance_start", "maintenance_done"]


def test_a_failing_action_stops_the_rollout_and_the_node_stays_out_in_repair(world: World) -> None:
    w = world
    first = w.ids[0]
    rid = w.m.plan({"selector": f"nodes:{first},{w.ids[1]},{w.ids[2]}", "action": "script:fw-update"}, "op").id
    w.m.start(rid, "op")
    assert w.run(rid, fail=frozenset({first})) == "stopped"
    assert w.steps(rid) == {first: "failed", w.ids[1]: "pending", w.ids[2]: "pending"}
    for _ in range(5):  # nothing more starts, and the failed node never comes back
        w.step(60)
        w.agents()
    assert w.steps(rid)[w.ids[1]] == "pending" and w.c.state_of(first) == "repair"
    assert "DRAIN" not in str(w.s.node(w.ids[1]).state) and w.s.node(first).state == SchedNodeState.DRAINED
    assert [n for n, _ in w.ran] == [first]
    assert "stopped (on_failure = stop)" in w.m.store.get(rid).reason


def test_pause_holds_the_action_and_abort_returns_a_drained_node_untouched(world: World) -> None:
    w = world
    a, b = w.ids[0], w.ids[3]
    rid = w.m.plan({"selector": f"nodes:{a},{b}", "action": "reboot"}, "op").id
    w.m.start(rid, "op")
    w.step()
    w.m.pause(rid, "op", "change window closed")
    for _ in range(4):
        w.step()
    assert w.c.state_of(a) == "drained" and w.steps(rid) == {a: "draining", b: "pending"}
    assert w.repairs.pending(a) == [], "paused: the action is not sent"
    with pytest.raises(Conflict, match="is paused"):
        w.m.pause(rid, "op")
    assert w.m.abort(rid, "op", "postponed").state == "aborting", "a is drained: it is returned first"
    w.step()
    assert w.steps(rid) == {a: "skipped", b: "skipped"} and w.m.store.get(rid).state == "aborted"
    w.validations()
    w.step()
    w.step()
    assert w.c.state_of(a) == "ready" and not w.s.node(a).reason, "revalidated and back"
    assert w.ran == [] and w.repairs.command(f"maint:{rid}:{a}") is None


def test_a_restart_mid_action_resumes_the_same_command_and_never_queues_it_twice(world: World) -> None:
    w = world
    n = w.ids[1]
    rid = w.m.plan({"selector": f"nodes:{n}", "action": "reboot"}, "op").id
    w.m.start(rid, "op")
    for _ in range(4):
        w.step()
    assert w.steps(rid) == {n: "action"} and len(w.repairs.pending(n)) == 1
    w.restart()  # the controller comes back on the same database
    w.step()
    assert len(w.repairs.pending(n)) == 1
    assert w.run(rid) == "done"
    assert w.ran == [(n, f"maint:{rid}:{n}")]
    assert [a for a, _ in w.audit(n)].count("maintenance_action") == 1


def test_an_action_without_result_in_time_fails_and_the_node_stays_out(world: World) -> None:
    w = world
    n = w.ids[2]
    rid = w.m.plan({"selector": f"nodes:{n}", "action": "reboot", "action_timeout": "5m",
                    "on_failure": "continue"}, "op").id
    w.m.start(rid, "op")
    for _ in range(4):
        w.step()
    assert w.steps(rid) == {n: "action"}
    w.step(6 * 60)
    assert w.m.store.get(rid).state == "done" and w.steps(rid) == {n: "failed"}
    assert w.repairs.pending(n) == [] and w.c.state_of(n) == "repair"


def test_a_bad_plan_is_refused_naming_the_field(world: World) -> None:
    with pytest.raises(InvalidInput) as err:
        world.m.plan({"selector": "rack:nowhere", "action": "reboot"}, "op")
    assert err.value.field == "selector" and "matches at least one" in err.value.expected


def test_an_unreadable_scheduler_starts_nothing_and_the_rollout_goes_on_once_it_answers(world: World) -> None:
    w = world
    rid = w.m.plan({"selector": f"nodes:{w.ids[0]}", "action": "reboot"}, "op").id
    w.m.start(rid, "op")
    w.s.set_reachable(False)
    for _ in range(3):
        w.step()
    assert w.steps(rid) == {w.ids[0]: "pending"} and w.c.state_of(w.ids[0]) == "ready"
    assert w.m.waiting[rid][w.ids[0]].startswith("scheduler unreadable"), "fail closed, and it says why"
    w.s.set_reachable(True)
    assert w.run(rid) == "done" and [n for n, _ in w.ran] == [w.ids[0]]


def test_the_per_domain_limit_holds_when_it_is_tighter_than_the_fleet_limit(world: World) -> None:
    # 6 nodes in 2 racks; the fleet may lose 4 at once but each rack only 1: never two of a rack out,
    # so at most 2 out in all, and the rollout takes 3 rounds instead of 2.
    w = world
    domains = {n: w.c.engine.nodes[n].domains for n in w.ids}
    assert len(set().union(*domains.values())) >= 2, "the fleet spans several domains"
    rid = w.m.plan({"selector": "all", "action": "reboot", "max_unavailable": 4, "max_unavailable_domain": 1},
                   "op").id
    w.m.start(rid, "op")
    worst: dict[str, int] = {}
    for _ in range(80):
        w.step()
        w.agents()
        w.validations()
        out = w.c.engine.unavailable() | {n.name for n in w.s.list_nodes() if n.state not in
                                          (SchedNodeState.IDLE, SchedNodeState.ALLOCATED)}
        for d in set().union(*domains.values()):
            worst[d] = max(worst.get(d, 0), sum(1 for n in out if d in domains[n]))
        if w.m.store.get(rid).state == "done":
            break
    assert w.m.store.get(rid).state == "done"
    assert set(w.steps(rid).values()) == {"done"}
    racks = {d: v for d, v in worst.items() if sum(1 for n in w.ids if d in domains[n]) < len(w.ids)}
    assert racks and max(racks.values()) == 1, worst
    assert w.max_out == 2
