"""The demo end to end: real controller, simulated world; reproducible; the JSON contract for scripts;
its failing leaf switch is one correlated decision for the nodes behind it."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from gpufleet.demo.run import DemoOptions, run_demo
from gpufleet.demo.scenario import FaultKind, schedule
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.fleet import ComponentKind
from gpufleet.domain.topology import Topology
from gpufleet.domain.topology_gen import generate_hgx
from gpufleet.lifecycle.states import NodeState

ROOT = Path(__file__).resolve().parents[3]


NODES, HOURS = 24, 8


def quick(seed: int) -> dict[str, object]:
    return run_demo(DemoOptions(seed=seed, duration=timedelta(hours=HOURS), nodes=NODES, headless=True,
                                serve_api=False))


@pytest.fixture(scope="module")
def run11() -> dict[str, object]:
    return quick(11)


def hosts_cabled_to(topo: Topology, switch: str) -> set[str]:
    """The hosts with a NIC cabled to ``switch``, read off the topology's links."""
    out = set()
    for lid in topo.links_of(switch):
        far = topo.links[lid].other(switch)
        if topo.components[far].kind == ComponentKind.NIC:
            host = topo.components[far].parent
            assert host is not None
            out.add(host)
    return out


def test_same_seed_same_run_and_the_loop_closes(run11: dict[str, object]) -> None:
    a, b = dict(run11), quick(11)
    a.pop("api"), b.pop("api")
    assert a == b
    assert a["nodes"] == 24
    # Faults were injected, nodes were drained, repaired and returned to service through revalidation.
    assert isinstance(a["drained"], int) and a["drained"] >= 4
    assert isinstance(a["returned_to_service"], int) and a["returned_to_service"] >= 1
    # The buggy health check flagged 60 % of the fleet: the breaker tripped instead of draining them.
    assert isinstance(a["breaker_trips"], int) and a["breaker_trips"] >= 1
    decisions = a["decisions"]
    assert isinstance(decisions, dict) and decisions.get("held", 0) >= 5
    ettr = a["ettr"]
    assert isinstance(ettr, float) and 0.0 < ettr < 1.0
    d2d = a["detect_to_drain_s"]
    assert isinstance(d2d, dict) and d2d["fatal"]["count"] >= 3


def test_delivered_spares_are_burned_in_and_time_to_market_is_reported(run11: dict[str, object]) -> None:
    ttm, spares = run11["ttm"], max(2, 24 // 8)  # the demo delivers its spares new: they burn in first
    assert isinstance(ttm, dict)
    assert ttm["nodes"] == 24 and ttm["burned_in"] == spares
    assert ttm["failures_found"] >= 1  # one delivered node is dead on arrival: burn-in catches it
    until = {u["share"]: u["after_s"] for u in ttm["until"]}
    assert until[50] == 0  # most of the fleet was in service at registration
    assert until[100] is not None and until[100] > ttm["median_burn_in_s"] > 0  # the DOA node came last
    timeline = run11["timeline"]
    assert isinstance(timeline, list) and any("start burn-in" in line for line in timeline)
    revalidated, returned = run11["revalidated"], run11["returned_to_service"]
    assert isinstance(revalidated, int) and isinstance(returned, int) and 1 <= revalidated <= returned


def test_the_failing_leaf_is_one_correlated_decision_for_the_nodes_behind_it(run11: dict[str, object]) -> None:
    summary = run11
    topo = generate_hgx(NODES, seed=11)  # the demo's fleet is this generator's, at this size
    correlated = summary["correlated"]
    assert isinstance(correlated, list) and len(correlated) == 1, correlated  # one decision, not one per node
    leaf = correlated[0]
    assert leaf["component"] in topo.of_kind(ComponentKind.LEAF_SWITCH) and leaf["kind"] == "leaf_switch"
    behind = hosts_cabled_to(topo, leaf["component"])
    assert leaf["nodes_behind"] == len(behind) == NODES  # one scalable unit: every node has a NIC on each leaf
    taken = set(leaf["nodes"])
    # Every node behind the leaf that was still serving; at most the six single-node faults injected
    # before it (see scenario._PLAN) can have had a node out of service already.
    assert taken <= behind and len(behind - taken) <= 6
    # Over the budget (10 % of the fleet): held by the breaker as one group, approved once, drained.
    assert leaf["decision"] == "held" and "approved by the operator" in leaf["outcome"]
    drained = summary["drained_nodes"]
    assert isinstance(drained, list) and taken <= set(drained)
    timeline = summary["timeline"]
    assert isinstance(timeline, list)
    assert any(f"inject leaf_switch_failure: leaf switch {leaf['component']} fails" in line for line in timeline)
    assert any(f"technicians replaced {leaf['component']}" in line for line in timeline)


def test_injected_events_name_topology_components_and_links() -> None:
    topo = generate_hgx(NODES, seed=3)
    injections = schedule(topo, timedelta(hours=HOURS), 3)
    by_kind = {i.kind: i for i in injections}
    assert set(FaultKind) <= set(by_kind)
    for inj in injections:
        for t in inj.targets:
            assert t.component in topo and topo.node_of(t.component) == t.node, t
            if t.link is not None:
                link = topo.links[t.link]
                assert t.component in (link.a, link.b), t
    kinds = {k: topo.components[by_kind[k].targets[0].component].kind for k in
             (FaultKind.XID79, FaultKind.XID48, FaultKind.XID94, FaultKind.XID95, FaultKind.NVLINK, FaultKind.NOISE)}
    assert set(kinds.values()) == {ComponentKind.GPU}
    nvlink = by_kind[FaultKind.NVLINK].targets[0]
    assert nvlink.link is not None and topo.links[nvlink.link].kind == "nvlink"
    assert topo.components[topo.links[nvlink.link].other(nvlink.component)].kind == ComponentKind.NVSWITCH
    for kind in (FaultKind.LINK_FLAP, FaultKind.SWITCH):
        for t in by_kind[kind].targets:
            assert topo.components[t.component].kind == ComponentKind.NIC and t.link is not None
            assert topo.components[topo.links[t.link].other(t.component)].kind == ComponentKind.LEAF_SWITCH
    switch = by_kind[FaultKind.SWITCH]
    assert switch.culprit is not None and set(switch.nodes) == hosts_cabled_to(topo, switch.culprit)
    assert {topo.links[t.link].other(t.component) for t in switch.targets if t.link} == {switch.culprit}


def test_the_live_view_in_an_80_column_log_shows_whole_decisions_and_ends_its_line() -> None:
    """Piped to a file or a CI log, Rich draws 80 columns and only the last frame: the decisions table
    still shows each decision's node and move whole (the reason column gives way), and the frame ends
    with a line break, so what is printed after it starts on a line of its own."""
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=False, color_system=None)
    run_demo(DemoOptions(seed=5, duration=timedelta(hours=2), nodes=8, headless=False, serve_api=False,
                         wall_seconds=0), console=console)
    text = out.getvalue()
    assert text.endswith("\n") and text.rstrip().endswith("╯")
    states = "|".join(s.value for s in NodeState)
    rows = [ln for ln in text.splitlines() if re.search(rf"\b({states})->({states})\b", ln)]
    assert rows, text
    assert all(re.search(r"\+\s*\d+\.\dh", ln) and re.search(r"\br\d{2}-n\d{2}\b", ln) for ln in rows), rows


def test_different_seeds_differ() -> None:
    a, b = quick(1), quick(2)
    assert a["timeline"] != b["timeline"]  # (every node is drained in both: the failing leaf serves them all)


def test_cli_headless_json_has_the_documented_keys() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli", "demo", "--headless", "--json", "--duration", "4h", "--nodes", "16",
         "--seed", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    summary = json.loads(out.stdout)
    for key in ("nodes", "interruptions", "drained", "returned_to_service", "ettr", "correlated", "timeline"):
        assert key in summary, key
    assert summary["nodes"] == 16 and summary["racks"] == 4  # HGX: 4 nodes to a rack
    assert summary["api"].startswith("http://127.0.0.1:")


@pytest.mark.parametrize(("kw", "field"), [({"nodes": 2}, "--nodes"), ({"nodes": 5000}, "--nodes"),
                                           ({"duration": timedelta(minutes=5)}, "--duration")])
def test_bad_options_name_the_flag(kw: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        run_demo(DemoOptions(headless=True, serve_api=False, **kw))  # type: ignore[arg-type]
    assert err.value.field == field


def test_cli_bad_duration_exits_2_with_the_field() -> None:
    out = subprocess.run([sys.executable, "-m", "gpufleet.cli", "demo", "--headless", "--duration", "soon"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2
    assert "--duration" in out.stderr and "soon" in out.stderr
