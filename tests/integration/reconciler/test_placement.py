"""Suspect nodes are placed last, level-triggered: set when a node turns suspect, set again when the
scheduler forgets it, undone when the node leaves suspect; never in dry-run or for unmanaged nodes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.reconciler import Reconciler
from gpufleet.controller.service import Controller
from gpufleet.controller.store.db import make_engine, migrate
from gpufleet.controller.store.repo import Store
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.fleet import simulated_fleet
from gpufleet.lifecycle.config import parse_policy
from gpufleet.lifecycle.engine import OperatorOp
from gpufleet.lifecycle.states import NodeState
from gpufleet.schedulers.sim import SimScheduler

T0 = datetime(2026, 11, 21, 12, tzinfo=UTC)
POLICY = {"breaker": {"max_unavailable_fleet": 1.0, "max_unavailable_domain": 1.0},
          "policy": {"checkpoint_wait_timeout": "12h", "heartbeat_timeout": "0s", "auto_repair": False}}


class World:
    def __init__(self, tmp: Path, policy: dict[str, dict[str, object]] = POLICY) -> None:
        engine = make_engine(f"sqlite:///{tmp / 'g.db'}")
        migrate(engine)
        self.clock = ManualClock(T0)
        fleet = simulated_fleet(4, 1)
        self.ids = [n.id for n in fleet]
        self.s = SimScheduler([*self.ids, "login-1"])  # login-1: a node gpufleet does not manage
        self.c = Controller(Store(engine), parse_policy(policy), self.clock)
        self.c.register_fleet(fleet)
        self.r = Reconciler(self.c, self.s)

    def step(self) -> None:
        self.clock.advance(timedelta(seconds=5))
        self.r.run_once()

    def degrade_busy(self, node: str) -> None:
        """A degraded XID on a node running a job that never checkpoints: suspect until the deadline."""
        self.s.submit("train", [node], start=self.clock.now())
        self.step()
        self.c.ingest([HealthEvent(f"{node}-94", node, EventKind.XID, self.clock.now(), f"{node}-gpu0", 94)])


def test_a_suspect_is_placed_last_until_it_leaves_suspect(tmp_path: Path) -> None:
    w = World(tmp_path)
    n = w.ids[0]
    w.degrade_busy(n)
    assert w.c.state_of(n) == NodeState.SUSPECT
    w.step()
    assert w.s.node(n).placed_last
    assert not any(w.s.node(m).placed_last for m in w.ids[1:])
    audit = [a for a in w.c.store.audit(target=n) if a.action == "place_last"]
    assert len(audit) == 1 and "still schedulable" in audit[0].detail
    w.s.finish(w.s.list_jobs()[0].id)  # the job ends; the node is free again but still suspect...
    w.c.operate(n, OperatorOp.RESUME, "op-1", "false alarm")  # ...until an operator clears it
    w.step()
    assert w.c.state_of(n) in (NodeState.READY, NodeState.IN_SERVICE)
    assert not w.s.node(n).placed_last
    newest_first = [a.action for a in w.c.store.audit(target=n) if a.action.startswith("place_")]
    assert newest_first == ["place_normally", "place_last"]


def test_a_preference_the_scheduler_forgot_is_set_again_and_others_are_left_alone(tmp_path: Path) -> None:
    w = World(tmp_path)
    n = w.ids[1]
    w.degrade_busy(n)
    w.step()
    assert w.s.node(n).placed_last
    w.s.place_last(n, False)  # what `scontrol reconfigure` does to a weight set by scontrol
    w.s.place_last("login-1", True)  # someone else's node: not gpufleet's to change
    w.step()
    assert w.s.node(n).placed_last and w.s.node("login-1").placed_last
    assert sum(1 for a in w.c.store.audit(target=n) if a.action == "place_last") == 2


def test_the_policy_switch_turns_it_off(tmp_path: Path) -> None:
    w = World(tmp_path, {**POLICY, "policy": {**POLICY["policy"], "place_suspects_last": False}})
    n = w.ids[2]
    w.degrade_busy(n)
    w.step()
    assert w.c.state_of(n) == NodeState.SUSPECT
    assert not w.s.node(n).placed_last


def test_dry_run_changes_nothing_in_the_scheduler(tmp_path: Path) -> None:
    w = World(tmp_path)
    n = w.ids[2]
    w.degrade_busy(n)
    assert w.c.state_of(n) == NodeState.SUSPECT
    w.c.set_dry_run(True, "op-1")
    w.step()
    assert not w.s.node(n).placed_last
    w.c.set_dry_run(False, "op-1")
    w.step()
    assert w.s.node(n).placed_last
