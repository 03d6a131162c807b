"""Identity: agents' local names -> topology ids, and moves judged from reported serials."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.controller.identity import Identity
from gpufleet.correlate.engine import Engine
from gpufleet.correlate.model import Basis
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.fleet import ComponentKind as K
from gpufleet.domain.inventory import GpuUnit, NicUnit, NodeInventory
from gpufleet.domain.topology import Component, Topology
from gpufleet.domain.topology_gen import generate_hgx, generate_nvl72
from tests.inventories import inventory_of

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def hgx() -> Topology:
    return generate_hgx(8)


@pytest.fixture(scope="module")
def nvl() -> Topology:
    return generate_nvl72(2)


def ev(node: str, component: str | None = None, link: str | None = None, kind: EventKind = EventKind.XID,
       **attrs: str) -> HealthEvent:
    return HealthEvent(f"e-{node}-{len(attrs)}", node, kind, T0, component=component, code=79, link=link,
                       attrs=tuple(sorted(attrs.items())))


# -- names --------------------------------------------------------------------------------------------


def test_gpu_index_names_the_gpu_in_natural_order() -> None:
    ids = [f"n1-gpu{i}" for i in (11, 2, 10, 0, 1, 3, 4, 5, 6, 7, 8, 9)]  # listed out of order on purpose
    topo = Topology.of([Component("n1", K.NODE), *(Component(g, K.GPU, "n1") for g in ids)])
    ident = Identity(topo)
    assert ident.resolve(ev("n1", None, gpu="10")).component == "n1-gpu10"
    assert ident.resolve(ev("n1", None, gpu="2")).component == "n1-gpu2"
    assert ident.resolve(ev("n1", "n1-gpu3", gpu="12")).component == "n1"  # no such GPU: the node


def test_pci_names_the_gpu_and_an_unknown_pci_names_the_node(hgx: Topology) -> None:
    ident = Identity(hgx)
    ident.register(inventory_of(hgx, "r01-n02", pci={5: "0000:9a:00.0", 6: "0000:ba:00.0"}), T0)
    assert ident.resolve(ev("r01-n02", None, pci="0000:9A:00.0")).component == "r01-n02-gpu5"
    assert ident.resolve(ev("r01-n02", "r01-n02-gpu0", pci="0000:ff:00.0")).component == "r01-n02"


def test_hca_names_the_nic_by_position_and_its_ib_link(hgx: Topology) -> None:
    ident = Identity(hgx)
    devices = ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]  # 2, 3: storage
    ident.register(inventory_of(hgx, "r01-n01", nic_devices=devices), T0)
    e = ident.resolve(ev("r01-n01", "r01-n01-nic2", kind=EventKind.LINK_DOWN, device="mlx5_6", port="1"))
    assert (e.component, e.link) == ("r01-n01-nic4", "r01-n01-nic4~leaf-su1-r4")
    no_port = ident.resolve(ev("r01-n01", None, kind=EventKind.LINK_FLAP, device="mlx5_9"))
    assert (no_port.component, no_port.link) == ("r01-n01-nic7", "r01-n01-nic7~leaf-su1-r7")
    other_port = ident.resolve(ev("r01-n01", None, kind=EventKind.LINK_DOWN, device="mlx5_9", port="2"))
    assert (other_port.component, other_port.link) == ("r01-n01-nic7", None)
    assert dict(other_port.attrs) == {"device": "mlx5_9", "port": "2"}


def test_hca_names_sort_naturally() -> None:
    nics = [Component(f"h1-nic{k}", K.NIC, "h1") for k in range(12)]
    ident = Identity(Topology.of([Component("h1", K.NODE), *nics]))
    ident.register(NodeInventory("h1", nics=tuple(NicUnit(f"mlx5_{k}") for k in (10, 2, 11, 0, 1, 3, 4, 5, 6, 7, 8,
                                                                                  9))), T0)
    assert ident.resolve(ev("h1", None, device="mlx5_10")).component == "h1-nic10"
    assert ident.resolve(ev("h1", None, device="mlx5_2")).component == "h1-nic2"


def test_nvlink_number_names_the_gpus_nth_nvlink(hgx: Topology, nvl: Topology) -> None:
    ident = Identity(hgx)
    e = ident.resolve(ev("r01-n01", "r01-n01-gpu3", "r01-n01-gpu3~nvlink2", gpu="3", nvlink="2"))
    assert (e.component, e.link) == ("r01-n01-gpu3", "r01-n01-gpu3~r01-n01-nvsw2")
    beyond = ident.resolve(ev("r01-n01", "r01-n01-gpu3", "r01-n01-gpu3~nvlink7", gpu="3", nvlink="7"))
    assert beyond.link is None and dict(beyond.attrs)["nvlink"] == "7"
    tray = Identity(nvl).resolve(ev("r01-ct03", "r01-ct03-gpu1", "r01-ct03-gpu1~nvlink5", gpu="1", nvlink="5"))
    assert (tray.component, tray.link) == ("r01-ct03-gpu1", "r01-ct03-gpu1~r01-sw3-nvsw1")


def test_topology_links_stay_local_links_go(hgx: Topology) -> None:
    ident = Identity(hgx)
    named = ev("r01-n01", "r01-n01-nic3", "r01-n01-nic3~leaf-su1-r3", kind=EventKind.LINK_DOWN)
    assert ident.resolve(named) is named
    pcie = ident.resolve(ev("r01-n01", "r01-n01-gpu2", "r01-n01-gpu2~pcie", kind=EventKind.AER_CORRECTED))
    assert (pcie.component, pcie.link) == ("r01-n01-gpu2", None)
    assert ident.resolve(ev("r01-n01", None)).component == "r01-n01"
    assert ident.resolve(ev("r01-n01", "r01-n01-dimm3")).component == "r01-n01"


def test_unknown_node_and_moved_events_are_unchanged(hgx: Topology) -> None:
    ident = Identity(hgx)
    stranger = ev("login-1", "login-1-gpu0", "login-1-gpu0~nvlink1", gpu="0", nvlink="1")
    assert ident.resolve(stranger) is stranger
    assert ident.node_component("login-1") is None and ident.node_component("r01-n01") == "r01-n01"
    assert ident.node_component("r01") is None  # a rack is not a node
    assert ident.register(NodeInventory("login-1", "SER-1", (GpuUnit(0, serial="G1"),)), T0) == []


def test_without_a_topology_names_normalise_and_links_go() -> None:
    ident = Identity(None)
    ident.register(NodeInventory("n7", gpus=(GpuUnit(5, pci="0000:9a:00.0"),),
                                 nics=(NicUnit("mlx5_6"), NicUnit("mlx5_0"), NicUnit("mlx5_11"))), T0)
    assert ident.resolve(ev("n7", None, pci="0000:9a:00.0")).component == "n7-gpu5"
    nic = ident.resolve(ev("n7", "n7-nic0", "n7-nic0~port1", kind=EventKind.LINK_DOWN, device="mlx5_11", port="1"))
    assert (nic.component, nic.link) == ("n7-nic2", None)
    assert ident.resolve(ev("n7", "n7-gpu1", pci="0000:ff:00.0")).component == "n7"
    assert ident.resolve(ev("n7", "n7-dimm3")).component == "n7-dimm3"
    assert ident.node_component("n7") is None


# -- moves --------------------------------------------------------------------------------------------


def _attrs(events: list[HealthEvent]) -> list[dict[str, str]]:
    return [dict(e.attrs) for e in events]


def test_gpu_swapped_between_two_nodes_is_two_moves_the_correlator_applies(hgx: Topology) -> None:
    a, b = "r01-n01", "r02-n03"
    ga, gb = hgx.components[f"{a}-gpu0"].serial, hgx.components[f"{b}-gpu0"].serial
    ident = Identity(hgx)
    inv_a, inv_b = inventory_of(hgx, a), inventory_of(hgx, b)
    swap_a = NodeInventory(a, inv_a.serial, (GpuUnit(0, serial=gb), *inv_a.gpus[1:]), inv_a.nics)
    swap_b = NodeInventory(b, inv_b.serial, (GpuUnit(0, serial=ga), *inv_b.gpus[1:]), inv_b.nics)
    first = ident.register(swap_a, T0)
    second = ident.register(swap_b, T0 + timedelta(seconds=5))
    assert _attrs(first) == [{"serial": gb, "from": "r02-n03-gpu0", "to": "r01-n01-gpu0"}]
    assert _attrs(second) == [{"serial": ga, "from": "r01-n01-gpu0", "to": "r02-n03-gpu0"}]
    m = first[0]
    assert (m.kind, m.node, m.source, m.time, m.severity) == (EventKind.MOVED, a, "controller", T0, None)
    assert first[0].id != second[0].id
    eng = Engine(hgx)
    for e in first + second:
        eng.observe_health_event(e)
    assert eng.inventory.serial_at("r01-n01-gpu0") == gb and eng.inventory.serial_at("r02-n03-gpu0") == ga


def test_a_tray_moved_between_racks_is_one_move_and_the_fault_follows_it(nvl: Topology) -> None:
    a, b = "r01-ct03", "r02-ct07"
    tray_a, tray_b = nvl.components[a].serial, nvl.components[b].serial
    ident = Identity(nvl)
    eng = Engine(nvl)
    at = T0
    for g in range(4):  # the fault at the old slot, named the way the agent names it
        for n in (2, 11, 13):
            at += timedelta(seconds=2)
            local = HealthEvent(f"x{g}{n}", a, EventKind.XID, at, f"{a}-gpu{g}", 149, link=f"{a}-gpu{g}~nvlink{n}",
                                attrs=(("gpu", str(g)), ("nvlink", str(n))))
            eng.observe_health_event(ident.resolve(local))
    moved = ident.register(inventory_of(nvl, a, node=b), T0 + timedelta(minutes=10))
    moved += ident.register(inventory_of(nvl, b, node=a), T0 + timedelta(minutes=10, seconds=1))
    assert _attrs(moved) == [{"serial": tray_a, "from": a, "to": b}, {"serial": tray_b, "from": b, "to": a}]
    for e in moved:
        eng.observe_health_event(e)
    assert eng.inventory.serial_at(f"{b}-gpu2") == nvl.components[f"{a}-gpu2"].serial  # carried with the tray
    at = T0 + timedelta(minutes=15)
    for g in range(4):  # the same fault, now reported by the agent at the new slot
        for n in (2, 11, 13):
            at += timedelta(seconds=2)
            local = HealthEvent(f"y{g}{n}", b, EventKind.XID, at, f"{b}-gpu{g}", 149, link=f"{b}-gpu{g}~nvlink{n}",
                                attrs=(("gpu", str(g)), ("nvlink", str(n))))
            eng.observe_health_event(ident.resolve(local))
    top = eng.suspects()[0]
    assert (top.component, top.serial, top.finding) == (b, tray_a, Basis.FOLLOWS_SERIAL)


def test_a_gpu_seen_elsewhere_moves_on_its_own_inside_a_moved_tray(nvl: Topology) -> None:
    a, b, c = "r01-ct03", "r02-ct07", "r01-ct05"
    stray = nvl.components[f"{c}-gpu1"].serial
    inv = inventory_of(nvl, a, node=b)
    inv = NodeInventory(b, inv.serial, (inv.gpus[0], GpuUnit(1, serial=stray), *inv.gpus[2:]), inv.nics)
    moved = Identity(nvl).register(inv, T0)
    assert _attrs(moved) == [{"serial": nvl.components[a].serial, "from": a, "to": b},
                             {"serial": stray, "from": f"{c}-gpu1", "to": f"{b}-gpu1"}]


def test_a_replacement_emits_nothing(hgx: Topology, caplog: pytest.LogCaptureFixture) -> None:
    inv = inventory_of(hgx, "r01-n01")
    fresh = NodeInventory(inv.node, inv.serial, (GpuUnit(0, serial="1659999999999"), *inv.gpus[1:]), inv.nics)
    with caplog.at_level(logging.INFO, logger="gpufleet.controller.identity"):
        assert Identity(hgx).register(fresh, T0) == []
    assert "r01-n01-gpu0" in caplog.text and "1659999999999" in caplog.text


def test_the_same_inventory_twice_emits_once(nvl: Topology) -> None:
    ident = Identity(nvl)
    inv = inventory_of(nvl, "r01-ct03", node="r02-ct07")
    assert len(ident.register(inv, T0)) == 1
    assert ident.register(inv, T0 + timedelta(minutes=1)) == []


def test_a_serial_reported_twice_in_one_inventory_is_no_move(hgx: Topology) -> None:
    ident = Identity(hgx)
    inv = inventory_of(hgx, "r01-n01")
    dual = NodeInventory(inv.node, inv.serial, inv.gpus, (NicUnit("mlx5_0", serial="MT-DUAL"),
                                                          NicUnit("mlx5_1", serial="MT-DUAL")))
    assert ident.register(dual, T0) == [] and ident.register(dual, T0 + timedelta(minutes=1)) == []


def test_load_remembers_without_emitting(nvl: Topology) -> None:
    inv = inventory_of(nvl, "r01-ct03", node="r02-ct07")
    assert len(Identity(nvl).register(inv, T0)) == 1  # without load, the move is news
    restarted = Identity(nvl)
    restarted.load([inv])
    assert restarted.register(inv, T0 + timedelta(hours=1)) == []
    back = restarted.register(inventory_of(nvl, "r01-ct03"), T0 + timedelta(hours=2))  # and moved back
    assert _attrs(back) == [{"serial": nvl.components["r01-ct03"].serial, "from": "r02-ct07", "to": "r01-ct03"}]


def test_moves_without_a_topology_use_normalised_slots() -> None:
    ident = Identity(None)
    n1 = NodeInventory("n1", "C1", (GpuUnit(0, serial="G10"), GpuUnit(1, serial="G11")))
    n2 = NodeInventory("n2", "C2", (GpuUnit(0, serial="G20"), GpuUnit(1, serial="G21")))
    assert ident.register(n1, T0) == [] and ident.register(n2, T0) == []  # first sight: nothing moved
    swapped = NodeInventory("n1", "C1", (GpuUnit(0, serial="G20"), GpuUnit(1, serial="G11")))
    assert _attrs(ident.register(swapped, T0 + timedelta(hours=1))) == [
        {"serial": "G20", "from": "n2-gpu0", "to": "n1-gpu0"}]
