"""topology.conf from a gpufleet topology: hand-built fabrics with known answers, and invariants on the
generated reference fabrics. (slurmctld reading the result: tests/integration/slurm/test_placement_real.py.)"""

from __future__ import annotations

import pytest

from gpufleet.domain.fleet import ComponentKind as K
from gpufleet.domain.topology import Component, Link, Topology
from gpufleet.domain.topology_gen import generate_hgx, generate_nvl72
from gpufleet.schedulers.slurm.hostlist import expand
from gpufleet.schedulers.slurm.topoconf import host_switches, topology_conf, tree


def _fabric(hosts: dict[str, list[str]], uplinks: dict[str, list[str]],
            kinds: dict[str, K] | None = None) -> Topology:
    """Hosts with one NIC per listed switch; switches joined to the switches they list."""
    kinds = kinds or {}
    comps = [Component(h, K.NODE) for h in hosts]
    links: list[Link] = []
    switches = {s for ss in hosts.values() for s in ss} | set(uplinks) | {s for ss in uplinks.values() for s in ss}
    comps += [Component(s, kinds.get(s, K.LEAF_SWITCH if s.startswith("leaf") else K.SPINE_SWITCH))
              for s in sorted(switches)]
    for h, leaves in hosts.items():
        for i, leaf in enumerate(leaves):
            comps.append(Component(f"{h}-nic{i}", K.NIC, parent=h))
            links.append(Link(f"{h}-nic{i}~{leaf}", "ib", f"{h}-nic{i}", leaf))
    for low, ups in uplinks.items():
        links += [Link(f"{low}~{up}", "ib", low, up) for up in ups]
    return Topology.of(comps, links)


def _lines(topo: Topology) -> list[str]:
    return [ln for ln in topology_conf(topo).splitlines() if not ln.startswith("#")]


def test_a_classic_fat_tree_is_leaves_under_one_spine_group() -> None:
    topo = _fabric({"h1": ["leaf-a"], "h2": ["leaf-a"], "h3": ["leaf-b"], "h4": ["leaf-b"]},
                   {"leaf-a": ["spine-1", "spine-2"], "leaf-b": ["spine-1", "spine-2"]})
    assert _lines(topo) == ["SwitchName=leaf-a Nodes=h[1-2]", "SwitchName=leaf-b Nodes=h[3-4]",
                            "SwitchName=spine Switches=leaf-a,leaf-b"]


def test_rail_leaves_serving_the_same_nodes_are_one_block() -> None:
    rails = ["leaf-su1-r0", "leaf-su1-r1", "leaf-su1-r2"]
    topo = _fabric({"gpu01": rails, "gpu02": rails, "gpu03": ["leaf-su2-r0", "leaf-su2-r1", "leaf-su2-r2"]},
                   {**{r: ["spine-r0"] for r in rails},
                    **{f"leaf-su2-r{i}": ["spine-r0"] for i in range(3)}})
    assert _lines(topo) == ["SwitchName=leaf-su1 Nodes=gpu[01-02]", "SwitchName=leaf-su2 Nodes=gpu03",
                            "SwitchName=spine-r0 Switches=leaf-su[1-2]"]
    assert "3 leaf switches serving the same hosts" in topology_conf(topo)


def test_separate_fabrics_stay_separate_and_hosts_without_a_fabric_are_named() -> None:
    topo = _fabric({"a1": ["leaf-x"], "b1": ["leaf-y"], "lonely": []}, {})
    text = topology_conf(topo, "t.json")
    assert _lines(topo) == ["SwitchName=leaf-x Nodes=a1", "SwitchName=leaf-y Nodes=b1",
                            "SwitchName=unconnected Nodes=lonely"]
    assert "reach no leaf switch" in text and "from t.json" in text


def test_a_partly_uplinked_fabric_stops_where_the_uplinks_stop() -> None:
    topo = _fabric({"a1": ["leaf-x"], "b1": ["leaf-y"]}, {"leaf-x": ["spine-1"]})
    assert _lines(topo) == ["SwitchName=leaf-x Nodes=a1", "SwitchName=leaf-y Nodes=b1"]


def test_group_names_never_collide() -> None:
    # two blocks whose leaves share the prefix "leaf-q" and a single leaf literally named "leaf-q"
    topo = _fabric({"a1": ["leaf-q-1", "leaf-q-2"], "b1": ["leaf-q"], "c1": ["leaf-q-3", "leaf-q-4"]}, {})
    names = [sw.name for sw in tree(topo)]
    assert len(names) == len(set(names)) == 3


@pytest.mark.parametrize("topo", [generate_hgx(64), generate_nvl72(3)], ids=["hgx64", "nvl72x3"])
def test_generated_fabrics_place_every_host_once_grouped_by_the_leaves_it_reaches(topo: Topology) -> None:
    hosts = sorted(h for k in (K.NODE, K.COMPUTE_TRAY) for h in topo.of_kind(k))
    placed = host_switches(topo)
    bottom = [sw for sw in tree(topo) if sw.nodes]
    listed = [h for sw in bottom for h in sw.children]
    assert sorted(listed) == hosts  # each host under exactly one bottom switch
    # hosts reaching the same leaves share a bottom switch; hosts reaching different leaves do not
    def leaves(h: str) -> frozenset[str]:
        return frozenset(topo.link(ln).other(nic) for nic in topo.children(h)
                         for ln in topo.links_of(nic) if topo.component(topo.link(ln).other(nic)).kind == K.LEAF_SWITCH)
    for a in hosts:
        for b in hosts[::7]:
            assert (placed[a] == placed[b]) == (leaves(a) == leaves(b)), (a, b)
    # the text lists what the tree says, with host lists Slurm expands to the same hosts
    text_hosts = [h for ln in _lines(topo) if " Nodes=" in ln for h in expand(ln.split(" Nodes=")[1])]
    assert sorted(text_hosts) == hosts
    # a single switch sits on top of a connected reference fabric
    tops = {sw.name for sw in tree(topo)} - {c for sw in tree(topo) if not sw.nodes for c in sw.children}
    assert len(tops) == 1
    assert topology_conf(topo) == topology_conf(topo)  # deterministic: rewriting changes nothing
