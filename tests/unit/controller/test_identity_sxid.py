"""An SXid names its NVSwitch chip, and with the port's far-end GPU the NVLink between them."""

from __future__ import annotations

from datetime import UTC, datetime

from gpufleet.controller.identity import Identity
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.fleet import ComponentKind
from gpufleet.domain.topology_gen import generate_hgx, generate_nvl72


def _sxid(node: str, **attrs: str) -> HealthEvent:
    return HealthEvent(id="s1", node=node, kind=EventKind.SXID, time=datetime(2026, 11, 24, tzinfo=UTC), code=20034,
                       component="0000:cc:00.0", attrs=(("pci", "0000:cc:00.0"), *attrs.items()))


def test_switch_and_peer_gpu_name_the_chip_and_the_link_between_them() -> None:
    topo = generate_hgx(2)
    node = "r01-n02"
    chips = topo.children_of_kind(node, ComponentKind.NVSWITCH)
    gpus = topo.children_of_kind(node, ComponentKind.GPU)
    e = Identity(topo).resolve(_sxid(node, nvswitch="2", peer_gpu="5", peer_nvlink="7", port="29"))
    assert e.component == chips[2]
    assert e.link is not None and {topo.link(e.link).a, topo.link(e.link).b} == {chips[2], gpus[5]}


def test_without_a_peer_the_chip_but_no_link() -> None:
    topo = generate_hgx(1)
    e = Identity(topo).resolve(_sxid("r01-n01", nvswitch="0", port="29"))
    assert (e.component, e.link) == (topo.children_of_kind("r01-n01", ComponentKind.NVSWITCH)[0], None)


def test_a_switch_or_gpu_the_topology_lacks_falls_back_to_the_node() -> None:
    topo = generate_hgx(1)
    ident = Identity(topo)
    assert ident.resolve(_sxid("r01-n01", nvswitch="9", peer_gpu="1")).component == "r01-n01"
    e = ident.resolve(_sxid("r01-n01", nvswitch="1", peer_gpu="99"))
    assert e.component.endswith("nvsw1") and e.link is None
    tray = generate_nvl72(1)  # NVL72: the chips sit in switch trays, not in the compute tray
    assert "r01-ct01" in tray
    assert Identity(tray).resolve(_sxid("r01-ct01", nvswitch="0", peer_gpu="1")).component == "r01-ct01"
