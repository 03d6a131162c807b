"""Agents' inventory reports for tests: how a moved unit reaches the controller (never a hand-written
``moved`` event: tests/e2e/test_topology_e2e.py checks that)."""

from __future__ import annotations

from gpufleet.domain.fleet import ComponentKind as K
from gpufleet.domain.inventory import GpuUnit, IbPort, NicUnit, NodeInventory
from gpufleet.domain.topology import Topology


def inventory_of(topo: Topology, slot: str, node: str | None = None, *, nic_devices: list[str] | None = None,
                 pci: dict[int, str] | None = None, serials: dict[str, str] | None = None) -> NodeInventory:
    """What the agent at ``node`` (default: the slot's own name) reports when the units of ``slot`` sit
    there; ``serials`` overrides the serial found at a GPU or NIC slot (a unit swapped in)."""
    gpus = topo.children_of_kind(slot, K.GPU)
    nics = topo.children_of_kind(slot, K.NIC)
    devices = nic_devices or [f"mlx5_{k}" for k in range(len(nics))]
    over = serials or {}

    def serial(c: str) -> str:
        return over.get(c) or topo.components[c].serial or ""

    return NodeInventory(
        node or slot,
        topo.components[slot].serial,
        tuple(GpuUnit(i, f"GPU-{i}", serial(g), (pci or {}).get(i, "")) for i, g in enumerate(gpus)),
        tuple(NicUnit(d, serial=serial(n), ports=(IbPort(1),)) for d, n in zip(devices, nics, strict=True)),
    )


def swap_reports(topo: Topology, a: str, b: str) -> tuple[NodeInventory, NodeInventory]:
    """The two nodes' next reports after the GPUs (or NICs) at slots ``a`` and ``b`` traded places."""
    node_a, node_b = topo.unit_of(a), topo.unit_of(b)
    assert node_a and node_b and node_a != node_b
    sa, sb = topo.components[a].serial or "", topo.components[b].serial or ""
    return (inventory_of(topo, node_b, serials={b: sa}), inventory_of(topo, node_a, serials={a: sb}))
