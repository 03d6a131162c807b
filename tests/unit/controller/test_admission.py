"""The controller's admission: one fault from several sources counts once; link events toward a switch
wait for the correlator, so a failing leaf is one decision. Real controller, real (in-memory) store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.service import Controller
from gpufleet.controller.store.db import migrate, throwaway_engine
from gpufleet.controller.store.repo import Store
from gpufleet.domain.catalog import load_default_catalog
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.topology import Topology, to_fleet
from gpufleet.domain.topology_gen import generate_hgx
from gpufleet.lifecycle.config import load_policy
from gpufleet.lifecycle.engine import SchedObservation
from gpufleet.lifecycle.states import NodeState

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def _controller(topology: Topology | None = None, nodes: int = 4) -> tuple[Controller, ManualClock]:
    topo = topology or generate_hgx(nodes)
    engine = throwaway_engine()
    migrate(engine)
    clock = ManualClock(T0)
    c = Controller(Store(engine), load_policy(), clock, topology=topology)
    c.register_fleet(to_fleet(topo), state=NodeState.READY)
    return c, clock


def _xid(ident: str, node: str, code: int, at: datetime, source: str, gpu: int = 1) -> HealthEvent:
    return HealthEvent(ident, node, EventKind.XID, at, f"{node}-gpu{gpu}", code, source=source,
                       attrs=(("gpu", str(gpu)),))


def _running_a_job(c: Controller, node: str) -> None:
    c.sync({node: SchedObservation(has_jobs=True, drained_empty=False)})
    assert c.state_of(node) is NodeState.IN_SERVICE


def test_one_xid_seen_by_nvml_and_the_kernel_log_is_one_fault_and_does_not_escalate() -> None:
    c, clock = _controller()
    _running_a_job(c, "r01-n01")
    at = clock.advance(timedelta(seconds=5))
    r1 = c.ingest([_xid("n:nvml:1", "r01-n01", 94, at, "nvml")])
    r2 = c.ingest([_xid("n:kmsg:1", "r01-n01", 94, at + timedelta(seconds=2), "kmsg")])
    assert (r1.accepted, r2.accepted) == (1, 1)
    # one contained-ECC fault: degraded (suspect, drain at the next checkpoint), not "twice in 24 h" fatal
    decisions = c.store.decisions()
    assert len(decisions) == 1 and decisions[0].severity == "degraded"
    assert c.state_of("r01-n01") is NodeState.SUSPECT
    rows = {r.id: r for r in c.store.events(node="r01-n01")}
    assert rows["n:kmsg:1"].fault_of == "n:nvml:1" and rows["n:nvml:1"].fault_of is None
    assert c.admission.merges == 1


FATAL_149 = "NETIR/NETIR_INT:0x00000000:000000"  # a row of NVIDIA's XID 144-150 decode judged fatal
INFO_149 = next(r for (k, c, r), e in load_default_catalog().subcodes.items()
                if (k, c) == ("xid", 149) and e.severity.value == "info")


def test_the_kernel_lines_decoded_row_counts_when_it_is_worse_than_nvmls_code_only_xid() -> None:
    """NVML reports XID 149 by code only (degraded); the kernel line for the same fault carries its
    decoded NVLink5 row, judged fatal: that sighting is counted, so the node is drained as fatal."""
    c, clock = _controller()
    _running_a_job(c, "r01-n01")
    at = clock.advance(timedelta(seconds=5))
    c.ingest([_xid("n:nvml:1", "r01-n01", 149, at, "nvml")])
    assert [d.severity for d in c.store.decisions()] == ["degraded"]
    row = HealthEvent("n:kmsg:1", "r01-n01", EventKind.XID, at + timedelta(seconds=1), "r01-n01-gpu1", 149,
                      source="kmsg", attrs=(("gpu", "1"), ("nvl5_row", FATAL_149)))
    c.ingest([row])
    assert sorted(d.severity for d in c.store.decisions()) == ["degraded", "fatal"]
    rows = {r.id: r for r in c.store.events(node="r01-n01")}
    assert rows["n:kmsg:1"].fault_of is None and c.admission.merges == 0
    # a third source repeating the fault at the fatal judgement is merged onto the counted one
    c.ingest([_xid("n:dcgm:1", "r01-n01", 149, at + timedelta(seconds=2), "dcgm")])
    assert {r.id: r for r in c.store.events(node="r01-n01")}["n:dcgm:1"].fault_of == "n:kmsg:1"


def test_a_decoded_row_no_worse_than_the_first_report_is_merged_as_before() -> None:
    c, clock = _controller()
    at = clock.advance(timedelta(seconds=5))
    c.ingest([_xid("n:nvml:1", "r01-n01", 149, at, "nvml")])
    row = HealthEvent("n:kmsg:1", "r01-n01", EventKind.XID, at + timedelta(seconds=1), "r01-n01-gpu1", 149,
                      source="kmsg", attrs=(("gpu", "1"), ("nvl5_row", INFO_149)))
    c.ingest([row])
    assert {r.id: r for r in c.store.events(node="r01-n01")}["n:kmsg:1"].fault_of == "n:nvml:1"
    assert c.admission.merges == 1 and len(c.store.decisions()) == 1


def test_the_same_xid_twice_from_one_source_or_far_apart_still_escalates() -> None:
    for second_source, gap in (("nvml", timedelta(seconds=2)), ("kmsg", timedelta(hours=2))):
        c, clock = _controller()
        _running_a_job(c, "r01-n01")
        at = clock.advance(timedelta(seconds=5))
        c.ingest([_xid("a", "r01-n01", 94, at, "nvml")])
        later = clock.advance(gap)
        c.ingest([_xid("b", "r01-n01", 94, later, second_source)])
        severities = sorted(d.severity for d in c.store.decisions())
        assert severities == ["degraded", "fatal"], (second_source, gap, severities)
        assert c.state_of("r01-n01") is NodeState.DRAINING
        assert all(r.fault_of is None for r in c.store.events(node="r01-n01"))


def _leaf_link_downs(topo: Topology, rail: int, nodes: list[str], at: datetime) -> list[HealthEvent]:
    out = []
    for n in nodes:
        nic = f"{n}-nic{rail}"
        [link] = [ln.id for ln in topo.links.values() if nic in (ln.a, ln.b) and ln.kind == "ib"]
        out.append(HealthEvent(f"{n}:ib_down", n, EventKind.LINK_DOWN, at, nic, link=link, source="infiniband",
                               attrs=(("rule", "ib_down"), ("device", f"mlx5_{rail}"), ("port", "1"))))
    return out


def test_a_failing_leaf_seen_by_its_nics_is_one_decision_not_one_per_node() -> None:
    topo = generate_hgx(8)
    c, clock = _controller(topo)
    nodes = sorted(n.id for n in to_fleet(topo))[:4]
    at = clock.advance(timedelta(seconds=5))
    for ev in _leaf_link_downs(topo, 3, nodes, at):
        c.ingest([ev])  # one NIC at a time, as the agents report
    assert c.admission.held == 4
    leaf = {ln.b if ln.a.endswith("nic3") else ln.a for ln in topo.links.values()
            if ln.kind == "ib" and (ln.a.endswith("-nic3") or ln.b.endswith("-nic3"))}
    group = [d for d in c.store.decisions() if d.actor_id.startswith("correlate:")]
    assert len(group) >= 1 and all(any(x in d.actor_id for x in leaf) for d in group)
    per_node_before = [d for d in c.store.decisions() if not d.actor_id.startswith("correlate:")]
    clock.advance(timedelta(seconds=30))
    c.tick()  # the hold ends: the covered link events make no per-node decisions
    per_node = [d for d in c.store.decisions() if not d.actor_id.startswith("correlate:")]
    assert per_node == per_node_before == []
    assert c.admission.held == 0


def test_a_lone_link_down_reaches_the_per_node_policy_when_its_hold_ends() -> None:
    topo = generate_hgx(8)
    c, clock = _controller(topo)
    node = sorted(n.id for n in to_fleet(topo))[0]
    at = clock.advance(timedelta(seconds=5))
    c.ingest(_leaf_link_downs(topo, 2, [node], at))
    assert c.store.decisions() == [] and c.state_of(node) is NodeState.READY  # held for the correlator
    clock.advance(timedelta(seconds=10))
    c.tick()
    assert c.store.decisions() == []  # not yet: the hold is 20 s by default
    clock.advance(timedelta(seconds=15))
    c.tick()
    [d] = c.store.decisions()
    assert d.node == node and d.severity == "fatal" and c.state_of(node) is NodeState.DRAINING


def test_a_restart_remembers_recent_faults_for_merging_and_re_holds_link_events() -> None:
    topo = generate_hgx(32)
    engine = throwaway_engine()
    migrate(engine)
    clock = ManualClock(T0)
    c = Controller(Store(engine), load_policy(), clock, topology=topo)
    c.register_fleet(to_fleet(topo), state=NodeState.READY)
    nodes = sorted(n.id for n in to_fleet(topo))
    nodes = [nodes[0], nodes[-1]]  # two racks: both fit the budgets
    at = clock.advance(timedelta(seconds=5))
    c.ingest([_xid("n:nvml:1", nodes[0], 94, at, "nvml")])
    c.ingest(_leaf_link_downs(topo, 2, [nodes[1]], at))
    # the controller restarts (same database): the kernel log's copy of the XID still merges, and the
    # held link event is judged by the per-node policy once its hold ends
    c2 = Controller(Store(engine), load_policy(), clock, topology=topo)
    c2.ingest([_xid("n:kmsg:1", nodes[0], 94, at + timedelta(seconds=1), "kmsg")])
    assert {r.id: r.fault_of for r in c2.store.events(node=nodes[0])} == {"n:nvml:1": None, "n:kmsg:1": "n:nvml:1"}
    assert c2.admission.held == 1 and c2.state_of(nodes[1]) is NodeState.READY
    clock.advance(timedelta(seconds=30))
    c2.tick()
    assert c2.state_of(nodes[1]) is NodeState.DRAINING


def test_the_merge_index_costs_the_cycle_collector_nothing_and_a_third_source_still_merges() -> None:
    import gc

    c, clock = _controller()
    at = clock.advance(timedelta(seconds=5))
    c.ingest([_xid(f"n:nvml:{g}", "r01-n01", 13, at, "nvml", gpu=g) for g in range(8)])
    c.ingest([_xid("n:kmsg:0", "r01-n01", 13, at, "kmsg", gpu=0), _xid("n:dcgm:0", "r01-n01", 13, at, "dcgm", gpu=0)])
    assert c.admission.merges == 2  # both later sources merged onto the first: the entry grew its sources
    gc.collect()
    gc.collect()  # a tuple is untracked once the tuples inside it are: the sources, then the entry
    entries = list(c.admission._faults.items())
    assert len(entries) == 8
    assert not any(gc.is_tracked(k) or gc.is_tracked(f) for k, f in entries)
