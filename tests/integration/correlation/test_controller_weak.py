"""Weak-signal verdicts on one node reach the lifecycle (issue #14 item 4): every event is
informational, so the per-node policy never acts on them; the correlator's `degrading` (or
follows/stays across a move) finding does — as a drain after the next checkpoint, not a kill."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.service import Controller
from gpufleet.controller.store.db import make_engine, migrate
from gpufleet.controller.store.repo import Page, Store
from gpufleet.correlate.model import Basis
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.topology import Topology, to_fleet
from gpufleet.domain.topology_gen import generate_hgx
from gpufleet.lifecycle.config import parse_policy
from gpufleet.lifecycle.states import NodeState
from tests.inventories import swap_reports

T0 = datetime(2026, 11, 21, 12, tzinfo=UTC)
NODE = "r05-n02"


@pytest.fixture(scope="module")
def hgx() -> Topology:
    return generate_hgx(64)


def controller(tmp_path: Path, topo: Topology, policy: dict[str, object] | None = None) -> Controller:
    engine = make_engine(f"sqlite:///{tmp_path / 'g.db'}")
    migrate(engine)
    c = Controller(Store(engine), parse_policy(policy or {}), ManualClock(T0), topology=topo)
    c.register_fleet(to_fleet(topo), NodeState.READY)
    return c


def gpu_link_errors(topo: Topology, node: str, n: int) -> list[HealthEvent]:
    """``n`` GPUs of one node each log ONE corrected NVLink error, on links to different chips."""
    out = []
    for i in range(n):
        gpu = f"{node}-gpu{i}"
        links = [lid for lid in topo.links_of(gpu) if topo.links[lid].kind == "nvlink"]
        out.append(HealthEvent(f"le-{gpu}", node, EventKind.LINK_ERROR, T0 + timedelta(seconds=20 + 25 * i),
                               gpu, link=links[(5 * i) % len(links)]))
    return out


def test_a_weak_node_pattern_becomes_a_degrading_verdict_and_a_drain(tmp_path: Path, hgx: Topology) -> None:
    c = controller(tmp_path, hgx)
    events = gpu_link_errors(hgx, NODE, 6)
    for e in events[:3]:
        c.ingest([e])
    assert c.state_of(NODE) == NodeState.READY  # three GPUs: within the background
    for e in events[3:]:
        c.ingest([e])
    suspects = {s.component: s for s in c.verdicts}
    assert NODE in suspects and suspects[NODE].finding is Basis.DEGRADING
    assert c.state_of(NODE) in (NodeState.SUSPECT, NodeState.DRAINING)
    audit = [a for a in c.store.audit(page=Page(limit=100)) if a.action == "component_fault"]
    assert len(audit) == 1 and audit[0].target == NODE and "degrading" in audit[0].detail
    # Every other node stays in service.
    assert all(c.state_of(n) == NodeState.READY for n in to_fleet(hgx).nodes if n != NODE)


def test_the_policy_false_alarm_budget_decides_how_weak_a_pattern_is_acted_on(tmp_path: Path, hgx: Topology) -> None:
    """Four GPUs with one error each: within the default budget (1 false verdict per 1,000 node-days),
    beyond one ten times larger: the policy file's ``correlation_false_alarm_budget`` reaches the
    controller's correlator, and so does a restart's rebuilt one."""
    events = gpu_link_errors(hgx, NODE, 4)
    for sub in ("default", "looser"):
        (tmp_path / sub).mkdir()
    default = controller(tmp_path / "default", hgx)
    default.ingest(events)
    assert default.state_of(NODE) == NodeState.READY and not default.verdicts
    policy = {"policy": {"correlation_false_alarm_budget": 0.01}}
    looser = controller(tmp_path / "looser", hgx, policy)
    looser.ingest(events)
    suspects = {s.component: s for s in looser.verdicts}
    assert NODE in suspects and suspects[NODE].finding is Basis.DEGRADING
    assert looser.state_of(NODE) in (NodeState.SUSPECT, NodeState.DRAINING)
    restarted = Controller(looser.store, parse_policy(policy), ManualClock(T0 + timedelta(minutes=1)), topology=hgx)
    assert NODE in {s.component for s in restarted.verdicts}


def test_a_weak_nic_pattern_that_follows_its_unit_drains_the_new_node(tmp_path: Path, hgx: Topology) -> None:
    c = controller(tmp_path, hgx)
    clock = c.clock
    assert isinstance(clock, ManualClock)
    a, b = "r02-n01-nic3", "r09-n04-nic6"
    node_a, node_b = "r02-n01", "r09-n04"

    def pattern(nic: str, node: str, tag: str) -> list[HealthEvent]:
        """Three symbol errors on its port and two corrected AERs within six minutes."""
        port, at = hgx.links_of(nic)[0], clock.now()
        ev = [HealthEvent(f"{tag}-le{i}", node, EventKind.LINK_ERROR, at + timedelta(seconds=60 + 100 * i), nic,
                          link=port) for i in range(3)]
        ev += [HealthEvent(f"{tag}-aer{i}", node, EventKind.AER_CORRECTED,
                           at + timedelta(seconds=110 + 150 * i), nic) for i in range(2)]
        return sorted(ev, key=lambda e: e.time)

    sa = hgx.components[a].serial
    for e in pattern(a, node_a, "x"):
        clock.advance(e.time - clock.now())
        c.ingest([e])
    clock.advance(timedelta(minutes=2))
    for report in swap_reports(hgx, a, b):  # the agents' next inventories show the NICs swapped
        assert c.register_inventory(report)
    assert c.state_of(node_a) == NodeState.READY and c.state_of(node_b) == NodeState.READY
    for e in pattern(b, node_b, "y"):
        clock.advance(e.time - clock.now())
        c.ingest([e])
    suspects = {s.component: s for s in c.verdicts}
    assert b in suspects and suspects[b].finding is Basis.FOLLOWS_SERIAL and suspects[b].serial == sa
    assert c.state_of(node_b) in (NodeState.SUSPECT, NodeState.DRAINING)
    assert c.state_of(node_a) == NodeState.READY
