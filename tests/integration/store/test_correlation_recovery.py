"""The controller's correlation window survives a restart and a failed write (issue #16).

The correlation engine folds events into running scores and cannot be rolled back like the lifecycle
engine. Before this, a restart started it empty (three switch-port errors either side of a restart were
never seen together), and an ingest round whose write failed stayed counted in it, so the agent's resend
was counted twice. Now the controller rebuilds it from the stored window at start and after a failed
write. On SQLite and on the real PostgreSQL (the ``engine`` fixture).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select
from sqlalchemy.exc import OperationalError

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.service import Controller, IngestResult
from gpufleet.controller.store.models import DecisionRow
from gpufleet.controller.store.repo import Store
from gpufleet.correlate.model import SuspectAction
from gpufleet.domain.errors import ExternalError
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.topology import Topology, to_fleet
from gpufleet.domain.topology_gen import generate_hgx
from gpufleet.lifecycle.config import load_policy
from gpufleet.lifecycle.states import NodeState
from tests.integration.store.plans import T0

LEAF = "leaf-su1-r3"


@pytest.fixture(scope="module")
def hgx() -> Topology:
    return generate_hgx(64)


def start(engine: Engine, topo: Topology, *, register: bool = True) -> Controller:
    c = Controller(Store(engine), load_policy(), ManualClock(T0 + timedelta(minutes=1)), topology=topo)
    if register:
        c.register_fleet(to_fleet(topo), NodeState.READY)
    return c


def port_down(topo: Topology, i: int) -> HealthEvent:
    """Node ``i`` behind the leaf reports its rail-3 port down (three such nodes blame the leaf)."""
    n = sorted(topo.nodes_behind(LEAF))[i]
    return HealthEvent(f"ld-{n}", n, EventKind.LINK_DOWN, T0 + timedelta(seconds=i), f"{n}-nic3",
                       link=f"{n}-nic3~{LEAF}")


def decisions(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(DecisionRow)).scalar_one())


class Refuse:
    """Statements matching ``which`` fail as on a dropped server connection, ``times`` times."""

    def __init__(self, engine: Engine, which: Callable[[str], bool], times: int) -> None:
        self.which, self.left = which, times
        event.listen(engine, "before_cursor_execute", self._hook)
        self.engine = engine

    def _hook(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if self.left > 0 and self.which(statement):
            self.left -= 1
            raise OperationalError(statement, {}, ConnectionError("server closed the connection unexpectedly"))

    def off(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._hook)


def test_evidence_either_side_of_a_restart_is_seen_together(engine: Engine, hgx: Topology) -> None:
    first = start(engine, hgx)
    first.ingest([port_down(hgx, 0)])
    first.ingest([port_down(hgx, 1)])
    assert first.verdicts == []
    again = start(engine, hgx, register=False)  # the controller restarts on the same database
    assert again.correlator is not None and again.correlator.in_window == 2
    again.ingest([port_down(hgx, 2)])
    (leaf,) = [s for s in again.verdicts if s.component == LEAF]
    assert leaf.kind == "leaf_switch"
    assert set(leaf.evidence) == {port_down(hgx, i).id for i in range(3)}


def test_a_verdict_standing_at_a_restart_still_stands_and_decides_nothing_again(
        engine: Engine, hgx: Topology) -> None:
    first = start(engine, hgx)
    for i in range(3):
        first.ingest([port_down(hgx, i)])
    assert [s.component for s in first.verdicts] == [LEAF]
    made = decisions(engine)
    assert made > 0
    again = start(engine, hgx, register=False)
    assert [(s.component, s.kind) for s in again.verdicts] == [(LEAF, "leaf_switch")]
    assert decisions(engine) == made  # replaying the window is not deciding again
    assert again.ingest([port_down(hgx, 3)]) == IngestResult(1, 0, 0)  # the standing verdict covers it


def test_a_verdict_whose_decisions_were_not_written_is_reached_again_on_the_resend(
        engine: Engine, hgx: Topology) -> None:
    c = start(engine, hgx)
    c.ingest([port_down(hgx, 0)])
    c.ingest([port_down(hgx, 1)])
    # The third port makes the leaf verdict; writing its decisions fails (the events row went in first).
    refuse = Refuse(engine, lambda sql: sql.lstrip().upper().startswith("INSERT INTO DECISIONS"), times=1)
    try:
        with pytest.raises(ExternalError, match="database"):
            c.ingest([port_down(hgx, 2)])
    finally:
        refuse.off()
    assert decisions(engine) == 0
    assert c.verdicts == []  # no verdict stands on an event the database did not keep
    assert c.correlator is not None and c.correlator.in_window == 2
    # The agent's resend is counted once and decides: one decision per node behind the leaf.
    result = c.ingest([port_down(hgx, 2)])
    assert result.accepted == 1 and result.decisions == len(hgx.nodes_behind(LEAF))
    assert [s.component for s in c.verdicts] == [LEAF]
    assert c.correlator.in_window == 3
    assert decisions(engine) == result.decisions


def test_when_the_reload_fails_too_the_window_is_rebuilt_before_the_next_ingest(
        engine: Engine, hgx: Topology) -> None:
    c = start(engine, hgx)
    c.ingest([port_down(hgx, 0)])
    c.ingest([port_down(hgx, 1)])
    # The decisions' write fails and so does every read after it: the reload cannot rebuild anything.
    down = {"on": False}

    def gone(sql: str) -> bool:
        down["on"] = down["on"] or sql.lstrip().upper().startswith("INSERT INTO DECISIONS")
        return down["on"]

    refuse = Refuse(engine, gone, times=1_000)
    try:
        with pytest.raises(ExternalError, match="database"):
            c.ingest([port_down(hgx, 2)])
    finally:
        refuse.off()
    result = c.ingest([port_down(hgx, 2)])  # the database is back
    assert result.accepted == 1 and result.decisions == len(hgx.nodes_behind(LEAF))
    assert c.correlator is not None and c.correlator.in_window == 3
    assert [s.component for s in c.verdicts] == [LEAF]


def _weak_stream(topo: Topology) -> tuple[str, list[HealthEvent]]:
    """A marginal IB cable (HGX tune seed 5) after two hours of realistic background: the running engine
    names the cable; a cold replay of the last 30 minutes named nothing (test_prime.py). Every event
    names its node (a switch's report on a host port: the host's)."""
    from gpufleet.correlate.scenarios import Noise, TopologyKind
    from gpufleet.correlate.weak import Split, WeakFault, generate_weak

    sc = generate_weak(topo, TopologyKind.HGX, WeakFault.IB_CABLE, Noise.REALISTIC, 5, Split.TUNE,
                       timedelta(hours=2))
    out = []
    for e in sc.events:
        # A switch's report about a host port reaches the controller on behalf of that host's node.
        far = topo.links[e.link].other(e.component) if e.link and e.component else ""
        node = topo.node_of(e.component or "") or topo.node_of(far)
        assert node is not None, e
        out.append(HealthEvent(f"w{e.line}", node, e.kind, e.time, e.component, e.code, e.severity, e.link))
    return sc.truth, out


def test_a_restart_primes_the_background_and_stands_the_verdicts_it_stood(engine: Engine, hgx: Topology) -> None:
    truth, stream = _weak_stream(hgx)
    live = Controller(Store(engine), load_policy(), ManualClock(stream[0].time), topology=hgx)
    live.register_fleet(to_fleet(hgx), NodeState.READY)
    _ingest_as_agents(live, stream)
    standing = {s.component for s in live.verdicts if s.action is not SuspectAction.OBSERVE}
    assert truth in standing

    end = stream[-1].time
    store = Store(engine)
    window = live.correlator.window if live.correlator is not None else timedelta(0)
    before = list(store.events_between(end - window - timedelta(hours=2), end - window, batch=7))
    assert before and [e.time for e in before] == sorted(e.time for e in before)
    assert all(end - window - timedelta(hours=2) <= e.time < end - window for e in before)
    assert len(before) == sum(1 for e in stream if end - window - timedelta(hours=2) <= e.time < end - window)

    restarted = Controller(store, load_policy(), ManualClock(end), topology=hgx)
    assert {s.component for s in restarted.verdicts if s.action is not SuspectAction.OBSERVE} == standing


def _ingest_as_agents(c: Controller, stream: list[HealthEvent]) -> None:
    """As agents push: a batch per minute, the controller's clock at the batch's last event."""
    clock = c.clock
    assert isinstance(clock, ManualClock)
    batch: list[HealthEvent] = []
    for e in stream:
        if batch and e.time - batch[0].time >= timedelta(minutes=1):
            clock.advance(batch[-1].time - clock.now())
            c.ingest(batch)
            batch = []
        batch.append(e)
    clock.advance(batch[-1].time - clock.now())
    c.ingest(batch)


def test_a_store_that_reaches_back_less_far_primes_from_its_oldest_event(engine: Engine, hgx: Topology) -> None:
    """A controller that has run for 50 minutes: its store holds 20 minutes before the window, and the
    rebuilt engine learns its background over those 20 minutes, not over two hours it never saw."""
    _, stream = _weak_stream(hgx)
    end = stream[-1].time
    recent = [e for e in stream if e.time >= end - timedelta(minutes=50)]
    live = Controller(Store(engine), load_policy(), ManualClock(recent[0].time), topology=hgx)
    live.register_fleet(to_fleet(hgx), NodeState.READY)
    _ingest_as_agents(live, recent)
    store = Store(engine)
    oldest = store.oldest_event_time()
    assert oldest == min(e.time for e in recent)
    restarted = Controller(store, load_policy(), ManualClock(end), topology=hgx)
    coh = restarted.correlator.coherence if restarted.correlator is not None else None
    assert coh is not None
    assert coh._start == oldest.timestamp()  # what the rates' span is measured from


def test_a_store_error_while_priming_keeps_the_old_engine_and_rebuilds_on_the_next_round(
        engine: Engine, hgx: Topology) -> None:
    _, stream = _weak_stream(hgx)
    live = Controller(Store(engine), load_policy(), ManualClock(stream[0].time), topology=hgx)
    live.register_fleet(to_fleet(hgx), NodeState.READY)
    _ingest_as_agents(live, stream)
    before = live.correlator
    # The background read (events before the window, in batches) fails as on a dropped connection.
    refuse = Refuse(engine, lambda sql: "events.time <" in sql.replace('"', "") and "FROM events" in sql, times=1)
    try:
        live.rebuild()
    finally:
        refuse.off()
    assert refuse.left == 0  # the background read was tried, and failed
    assert live.correlator is before  # the old engine stays
    live.ingest([HealthEvent("after", stream[-1].node, EventKind.ECC_SBE, stream[-1].time, stream[-1].component)])
    assert live.correlator is not before  # rebuilt with the next round
