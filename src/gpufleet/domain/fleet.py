"""Fleet inventory: racks, nodes, GPUs, NICs and switches.

Every unit has a *slot id* (the position: ``r01-n03-gpu5``) and the *serial* of the physical unit
that sits there now. Positions are stable; serials move when hardware is swapped (an inventory
``moved`` event). The inventory also names each node's failure domains (rack, leaf switch), which
the blast-radius breaker budgets against.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gpufleet.domain.errors import InvalidInput


class ComponentKind(StrEnum):
    RACK = "rack"
    NODE = "node"
    COMPUTE_TRAY = "compute_tray"
    SWITCH_TRAY = "switch_tray"
    GPU = "gpu"
    NVSWITCH = "nvswitch"
    NIC = "nic"
    LEAF_SWITCH = "leaf_switch"
    SPINE_SWITCH = "spine_switch"
    CORE_SWITCH = "core_switch"


RACK_DOMAIN = "rack:"  # the prefix of a rack's failure-domain name (Node.domains)
SWITCH_DOMAIN = "switch:"  # ... and of a leaf switch's


def gpu_slot(unit: str, index: int) -> str:
    """The slot id of GPU ``index`` in node or compute tray ``unit`` (``r01-n03-gpu5``): the one naming
    rule every producer and the topology generators share."""
    return f"{unit}-gpu{index}"


def nic_slot(unit: str, index: int) -> str:
    """The slot id of NIC ``index`` in node or compute tray ``unit`` (``r01-n03-nic5``)."""
    return f"{unit}-nic{index}"


@dataclass(frozen=True, slots=True)
class Gpu:
    slot: str  # e.g. "r01-n03-gpu5"
    index: int  # CUDA/NVML index on the node
    serial: str
    pci: str = ""  # normalised dddd:bb:dd.f, used to map kernel-log lines to a GPU
    sku: str = "H100-SXM"


@dataclass(frozen=True, slots=True)
class Nic:
    slot: str
    index: int
    serial: str
    leaf: str = ""  # the leaf switch the NIC's cable lands on


@dataclass(frozen=True, slots=True)
class Node:
    id: str  # hostname / scheduler node name, also its slot
    rack: str
    serial: str = ""
    gpus: tuple[Gpu, ...] = ()
    nics: tuple[Nic, ...] = ()

    @property
    def leaves(self) -> frozenset[str]:
        return frozenset(n.leaf for n in self.nics if n.leaf)

    @property
    def domains(self) -> frozenset[str]:
        """Failure domains the node belongs to: its rack and every leaf switch its NICs land on."""
        return frozenset({f"{RACK_DOMAIN}{self.rack}"} | {f"{SWITCH_DOMAIN}{leaf}" for leaf in self.leaves})

    def gpu_by_pci(self, pci: str) -> Gpu | None:
        return next((g for g in self.gpus if g.pci == pci), None)


@dataclass(frozen=True, slots=True)
class Fleet:
    """An immutable snapshot of the inventory."""

    nodes: Mapping[str, Node] = field(default_factory=dict)

    @classmethod
    def of(cls, nodes: Iterable[Node]) -> Fleet:
        by_id: dict[str, Node] = {}
        for i, node in enumerate(nodes):
            if not node.id:
                raise InvalidInput(f"nodes[{i}].id", node.id, "a non-empty node name")
            if node.id in by_id:
                raise InvalidInput(f"nodes[{i}].id", node.id, "a node name not used before")
            by_id[node.id] = node
        return cls(nodes=by_id)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes.values())

    def __len__(self) -> int:
        return len(self.nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self.nodes

    def racks(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for node in self:
            out.setdefault(node.rack, []).append(node.id)
        return out

    def domain_members(self) -> dict[str, frozenset[str]]:
        """Each failure domain (``rack:R``, ``switch:S``) with the ids of the nodes in it."""
        out: dict[str, set[str]] = {}
        for node in self:
            for dom in node.domains:
                out.setdefault(dom, set()).add(node.id)
        return {d: frozenset(m) for d, m in out.items()}


def simulated_fleet(
    nodes: int = 32, racks: int = 4, gpus_per_node: int = 8, sku: str = "H100-SXM"
) -> Fleet:
    """A regular HGX-like fleet: ``nodes`` spread over ``racks``; NIC *i* of every node on rail leaf *i*
    of its rack's scalable unit (one leaf per rail per rack, i.e. a rack-local rail switch)."""
    if nodes < 1:
        raise InvalidInput("nodes", nodes, "at least 1")
    if racks < 1 or racks > nodes:
        raise InvalidInput("racks", racks, f"between 1 and the node count ({nodes})")
    if gpus_per_node < 1:
        raise InvalidInput("gpus_per_node", gpus_per_node, "at least 1")
    out: list[Node] = []
    for i in range(nodes):
        rack = f"r{i * racks // nodes + 1:02d}"
        nid = f"{rack}-n{i + 1:03d}"
        gpus = tuple(
            Gpu(slot=gpu_slot(nid, g), index=g, serial=f"GPU-{i:04d}{g:02d}", pci=_pci(g), sku=sku)
            for g in range(gpus_per_node)
        )
        nics = tuple(
            Nic(slot=nic_slot(nid, g), index=g, serial=f"NIC-{i:04d}{g:02d}", leaf=f"leaf-{rack}-rail{g}")
            for g in range(gpus_per_node)
        )
        out.append(Node(id=nid, rack=rack, serial=f"NODE-{i:05d}", gpus=gpus, nics=nics))
    return Fleet.of(out)


# HGX H100 boards put the 8 GPUs on these PCI buses (as seen in nvidia-smi on DGX H100).
_HGX_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


def _pci(index: int) -> str:
    bus = _HGX_BUSES[index] if index < len(_HGX_BUSES) else f"{0x10 + index:02x}"
    return f"0000:{bus}:00.0"
