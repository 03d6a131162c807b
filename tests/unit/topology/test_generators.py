"""Generated topologies match the reference counts (DGX SuperPOD RA table; DGX GB200 user guide)."""

from __future__ import annotations

from collections import Counter

import pytest

from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.fleet import ComponentKind as K
from gpufleet.domain.topology import Topology
from gpufleet.domain.topology_gen import generate_hgx, generate_nvl72


def _kinds(topo: Topology) -> Counter[str]:
    return Counter(c.kind.value for c in topo.components.values())


def _cables(topo: Topology, lower: K, upper: K) -> int:
    n = 0
    for ln in topo.links.values():
        ka, kb = topo.components[ln.a].kind, topo.components[ln.b].kind
        n += {ka, kb} == {lower, upper}
    return n


# (nodes, leaf, spine, core, node-leaf cables, leaf-spine cables, spine-core cables): the DGX SuperPOD
# reference architecture's table (faults-and-topology.md §2.2).
REFERENCE = [
    (64, 16, 8, 0, 512, 512, 0),
    (128, 32, 16, 0, 1024, 1024, 0),
    (256, 64, 32, 0, 2048, 2048, 0),
    (512, 128, 128, 64, 4096, 4096, 4096),
    (1024, 256, 256, 128, 8192, 8192, 8192),
    (2048, 512, 512, 256, 16384, 16384, 16384),
]


@pytest.mark.parametrize(("nodes", "leaf", "spine", "core", "nl", "ls", "sc"), REFERENCE)
def test_hgx_fabric_matches_superpod_reference(
    nodes: int, leaf: int, spine: int, core: int, nl: int, ls: int, sc: int
) -> None:
    topo = generate_hgx(nodes)
    kinds = _kinds(topo)
    assert kinds["leaf_switch"] == leaf
    assert kinds["spine_switch"] == spine
    assert kinds.get("core_switch", 0) == core
    assert _cables(topo, K.NIC, K.LEAF_SWITCH) == nl
    assert _cables(topo, K.LEAF_SWITCH, K.SPINE_SWITCH) == ls
    assert _cables(topo, K.SPINE_SWITCH, K.CORE_SWITCH) == sc


def test_hgx_node_has_8_gpus_4_nvswitches_8_rail_aligned_nics() -> None:
    topo = generate_hgx(40)
    node = "r03-n02"
    kids = Counter(topo.components[c].kind.value for c in topo.children(node))
    assert kids == {"gpu": 8, "nvswitch": 4, "nic": 8}
    for i in range(8):
        (lid,) = topo.links_of(f"{node}-nic{i}")
        far = topo.links[lid].other(f"{node}-nic{i}")
        assert far.endswith(f"-r{i}")  # rail i
        assert topo.components[far].kind == K.LEAF_SWITCH
    for g in range(8):
        ends = {topo.links[lid].other(f"{node}-gpu{g}") for lid in topo.links_of(f"{node}-gpu{g}")}
        assert ends == {f"{node}-nvsw{s}" for s in range(4)}


def test_nvl72_rack_counts_and_all_to_all_nvlink() -> None:
    topo = generate_nvl72(2)
    kinds = _kinds(topo)
    assert kinds["compute_tray"] == 36 and kinds["gpu"] == 144 and kinds["switch_tray"] == 18
    assert kinds["nvswitch"] == 36 and kinds["nic"] == 144
    gpu = "r02-ct07-gpu3"
    chips = {topo.links[lid].other(gpu) for lid in topo.links_of(gpu) if topo.links[lid].kind == "nvlink"}
    assert len(chips) == 18 and all(c.startswith("r02-sw") for c in chips)
    chip = "r01-sw9-nvsw1"
    gpus = {topo.links[lid].other(chip) for lid in topo.links_of(chip)}
    assert len(gpus) == 72 and all(g.startswith("r01-ct") for g in gpus)


@pytest.mark.parametrize("nodes", [1, 33, 300, 2100])
def test_no_switch_uses_more_than_64_ports(nodes: int) -> None:
    topo = generate_hgx(nodes)
    ports = Counter(end for ln in topo.links.values() if ln.kind == "ib" for end in (ln.a, ln.b))
    switch_ports = [n for c, n in ports.items() if topo.components[c].kind.value.endswith("_switch")]
    assert max(switch_ports) <= 64
    assert all(ports[c] == 1 for c in topo.of_kind(K.NIC))


def test_every_unit_has_a_distinct_serial() -> None:
    topo = generate_nvl72(1)
    serials = [c.serial for c in topo.components.values()]
    assert all(serials)
    assert len(set(serials)) == len(serials)
    assert generate_nvl72(1, seed=3).components["r01-ct01"].serial != topo.components["r01-ct01"].serial


def test_generators_reject_bad_sizes() -> None:
    with pytest.raises(InvalidInput) as err:
        generate_hgx(0)
    assert err.value.field == "nodes" and err.value.value == 0
    with pytest.raises(InvalidInput) as err:
        generate_nvl72(-1)
    assert err.value.field == "racks"
