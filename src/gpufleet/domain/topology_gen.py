"""Topology generators: HGX H100/H200 clusters and GB200 NVL72 racks on a rail-optimised fat-tree.

Counts follow docs/correlate.md §Topology (sources: NVIDIA DGX BasePOD / SuperPOD reference
architectures, DGX GB200 user guide; see /shared/reference/faults-and-topology.md §2):

* HGX node: 8 GPUs, 4 NVSwitch chips, 8 single-port compute NICs; NIC *i* is on rail *i*. Each GPU has
  one ``nvlink`` link to each of the node's 4 NVSwitch chips (a link stands for the bundle of NVLink
  lanes between that pair: 4 or 5 of a Hopper GPU's 18). 4 nodes per rack.
* NVL72 rack: 18 compute trays x 4 GPUs + 4 compute NICs, 9 switch trays x 2 NVSwitch chips. **Assumption**
  (third-party sources only): every GPU has one NVLink to every NVSwitch chip of its rack (72 x 18 =
  1,296 links = 18 chips x 72 ports).
* Rail fabric (shared): hosts are grouped 32 to a scalable unit (SU); each SU has one leaf per rail
  (``leaf-su{S}-r{R}``, 32 host ports + 32 uplinks, QM9700 radix 64). Up to 2,048 NIC endpoints the
  fabric has two tiers: one spine group per rail with ``ceil(SUs / 2)`` spines, each leaf's 32 uplinks
  spread round-robin over its rail's spines (DGX SuperPOD: 2 SU -> 16 leaf / 8 spine, 8 SU -> 64 / 32).
  Above 2,048 endpoints a core layer appears: each SU has as many spines as rails (``spine-su{S}-{j}``,
  the SU's leaves spread over them), spine *j* of every SU goes to core plane *j*, which has
  ``ceil(SUs / 2)`` cores (16 SU -> 128 spine / 64 core, 64 SU -> 512 / 256, matching the reference).
  Beyond 64 SUs no reference design exists; the same rule keeps every port count at 64 but spine
  uplinks then reach only 32 of their plane's cores (not non-blocking). Every cable is one link; a
  pair joined by several cables gets ``#k`` suffixes.

Serials are deterministic (``seed`` offsets them), so a generated file is reproducible.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.fleet import ComponentKind as K
from gpufleet.domain.fleet import gpu_slot, nic_slot
from gpufleet.domain.topology import Component, Link, Topology

HOSTS_PER_SU = 32
SWITCH_RADIX = 64
UPLINKS_PER_LEAF = SWITCH_RADIX // 2
TWO_TIER_MAX_ENDPOINTS = SWITCH_RADIX * SWITCH_RADIX // 2  # k^2/2 = 2,048
HGX_GPUS, HGX_NVSWITCHES, HGX_NICS, HGX_NODES_PER_RACK = 8, 4, 8, 4
NVL72_TRAYS, NVL72_GPUS_PER_TRAY, NVL72_NICS_PER_TRAY = 18, 4, 4
NVL72_SWITCH_TRAYS, NVL72_CHIPS_PER_SWITCH_TRAY = 9, 2
MAX_GPUS = 1_048_576


@dataclass(slots=True)
class _Builder:
    seed: int
    comps: list[Component] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)

    def add(self, cid: str, kind: K, parent: str | None, prefix: str) -> str:
        n = self.counters.get(prefix, 0)
        self.counters[prefix] = n + 1
        self.comps.append(Component(cid, kind, parent, _serial(prefix, self.seed, n)))
        return cid

    def link(self, a: str, b: str, kind: str, suffix: str = "") -> None:
        self.links.append(Link(f"{a}~{b}{suffix}", kind, a, b))


def _serial(prefix: str, seed: int, n: int) -> str:
    if prefix == "GPU":  # NVIDIA GPU serials are 13 digits
        return f"{1650000000000 + seed * 10_000_000 + n}"
    return f"{prefix}-{seed:02d}{n:07d}"


def generate_hgx(nodes: int, seed: int = 0) -> Topology:
    """An HGX H100/H200 cluster of ``nodes`` nodes (8 GPUs each) on a rail-optimised fat-tree."""
    if not 1 <= nodes <= MAX_GPUS // HGX_GPUS:
        raise InvalidInput("nodes", nodes, f"between 1 and {MAX_GPUS // HGX_GPUS}")
    b = _Builder(seed)
    width = max(2, len(str((nodes - 1) // HGX_NODES_PER_RACK + 1)))
    hosts: list[str] = []
    for i in range(nodes):
        rack = f"r{i // HGX_NODES_PER_RACK + 1:0{width}d}"
        if i % HGX_NODES_PER_RACK == 0:
            b.add(rack, K.RACK, None, "RACK")
        node = b.add(f"{rack}-n{i % HGX_NODES_PER_RACK + 1:02d}", K.NODE, rack, "NODE")
        hosts.append(node)
        sws = [b.add(f"{node}-nvsw{s}", K.NVSWITCH, node, "NVSW") for s in range(HGX_NVSWITCHES)]
        for g in range(HGX_GPUS):
            gpu = b.add(gpu_slot(node, g), K.GPU, node, "GPU")
            for sw in sws:
                b.link(gpu, sw, "nvlink")
        for n in range(HGX_NICS):
            b.add(nic_slot(node, n), K.NIC, node, "NIC")
    _rail_fabric(b, hosts, HGX_NICS, nic_slot)
    return Topology.of(b.comps, b.links)


def generate_nvl72(racks: int, seed: int = 0) -> Topology:
    """``racks`` GB200 NVL72 racks; compute NICs on a rail-optimised fat-tree (4 rails)."""
    per_rack = NVL72_TRAYS * NVL72_GPUS_PER_TRAY
    if not 1 <= racks <= MAX_GPUS // per_rack:
        raise InvalidInput("racks", racks, f"between 1 and {MAX_GPUS // per_rack}")
    b = _Builder(seed)
    width = max(2, len(str(racks)))
    hosts: list[str] = []
    for r in range(racks):
        rack = b.add(f"r{r + 1:0{width}d}", K.RACK, None, "RACK")
        chips: list[str] = []
        for s in range(NVL72_SWITCH_TRAYS):
            st = b.add(f"{rack}-sw{s + 1}", K.SWITCH_TRAY, rack, "SWTRAY")
            chips.extend(
                b.add(f"{st}-nvsw{c}", K.NVSWITCH, st, "NVSW") for c in range(NVL72_CHIPS_PER_SWITCH_TRAY)
            )
        for t in range(NVL72_TRAYS):
            tray = b.add(f"{rack}-ct{t + 1:02d}", K.COMPUTE_TRAY, rack, "TRAY")
            hosts.append(tray)
            for g in range(NVL72_GPUS_PER_TRAY):
                gpu = b.add(gpu_slot(tray, g), K.GPU, tray, "GPU")
                for chip in chips:
                    b.link(gpu, chip, "nvlink")
            for n in range(NVL72_NICS_PER_TRAY):
                b.add(nic_slot(tray, n), K.NIC, tray, "NIC")
    _rail_fabric(b, hosts, NVL72_NICS_PER_TRAY, nic_slot)
    return Topology.of(b.comps, b.links)


def _rail_fabric(b: _Builder, hosts: list[str], rails: int, nic: Callable[[str, int], str]) -> None:
    """Leaf/spine (and core above 2,048 endpoints) rail-optimised fat-tree over ``hosts``."""
    sus = (len(hosts) + HOSTS_PER_SU - 1) // HOSTS_PER_SU
    leaves: list[list[str]] = []  # [su][rail]
    for s in range(sus):
        row = [b.add(f"leaf-su{s + 1}-r{r}", K.LEAF_SWITCH, None, "LEAF") for r in range(rails)]
        leaves.append(row)
        for host in hosts[s * HOSTS_PER_SU : (s + 1) * HOSTS_PER_SU]:
            for r in range(rails):
                b.link(nic(host, r), row[r], "ib")
    per_group = (sus + 1) // 2
    if len(hosts) * rails <= TWO_TIER_MAX_ENDPOINTS:
        spines = [
            [b.add(f"spine-r{r}-{j + 1}", K.SPINE_SWITCH, None, "SPINE") for j in range(per_group)]
            for r in range(rails)
        ]
        for s in range(sus):
            for r in range(rails):
                _spread(b, leaves[s][r], spines[r], 0)
        return
    cores = [
        [b.add(f"core-p{j}-{c + 1}", K.CORE_SWITCH, None, "CORE") for c in range(per_group)]
        for j in range(rails)
    ]
    for s in range(sus):
        su_spines = [b.add(f"spine-su{s + 1}-{j}", K.SPINE_SWITCH, None, "SPINE") for j in range(rails)]
        for r in range(rails):
            _spread(b, leaves[s][r], su_spines, 0)
        for j, spine in enumerate(su_spines):
            _spread(b, spine, cores[j], s * UPLINKS_PER_LEAF)


def _spread(b: _Builder, lower: str, uppers: list[str], offset: int) -> None:
    """Cable ``lower``'s 32 uplinks round-robin over ``uppers`` starting at ``offset``."""
    count: dict[str, int] = {}
    for k in range(UPLINKS_PER_LEAF):
        up = uppers[(offset + k) % len(uppers)]
        count[up] = count.get(up, 0) + 1
    for up, n in count.items():
        if n == 1:
            b.link(lower, up, "ib")
        else:
            for k in range(n):
                b.link(lower, up, "ib", f"#{k + 1}")
