"""Identity when a unit is missing from an inventory: the units after the gap keep their slots (their
PCI addresses name them, from the node's last complete inventory), and the missing unit is reported."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.controller.identity import Identity
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.fleet import ComponentKind as K
from gpufleet.domain.inventory import GpuUnit, NicUnit, NodeInventory
from gpufleet.domain.topology import Component, Topology
from gpufleet.domain.topology_gen import generate_hgx, generate_nvl72
from tests.inventories import inventory_of

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
NODE = "r01-n01"


@pytest.fixture(scope="module")
def hgx() -> Topology:
    return generate_hgx(8)


def complete(topo: Topology, node: str = NODE) -> NodeInventory:
    """Every GPU and HCA of ``node``, each with the PCI address of its slot (as an agent reports them)."""
    inv = inventory_of(topo, node, pci={i: f"0000:{0x18 + 0x10 * i:02x}:00.0" for i in range(8)})
    return replace(inv, nics=tuple(replace(n, pci=f"0000:{0x19 + 0x10 * k:02x}:00.0") for k, n in enumerate(inv.nics)))


def without(inv: NodeInventory, gpu: int | None = None, hca: str | None = None) -> NodeInventory:
    """What the agent reports after a reboot without that unit: NVML numbers the GPUs after it one lower,
    and the mlx5 driver names the HCAs after it one lower (it names them in probe order)."""
    gpus = [g for g in inv.gpus if g.index != gpu]
    nics = [n for n in inv.nics if n.device != hca]
    return replace(inv, gpus=tuple(replace(g, index=i) for i, g in enumerate(gpus)),
                   nics=tuple(replace(n, device=f"mlx5_{k}") for k, n in enumerate(nics)))


def ev(component: str | None = None, kind: EventKind = EventKind.XID, **attrs: str) -> HealthEvent:
    return HealthEvent(f"e-{len(attrs)}", NODE, kind, T0, component=component, code=79,
                       attrs=tuple(sorted(attrs.items())))


def _ref(ident: Identity, node: str) -> NodeInventory | None:
    r = ident.reference(node)
    return r.inventory if r is not None else None


def summary(events: list[HealthEvent]) -> list[tuple[str, str | None, str, str]]:
    return [(e.kind.value, e.component, e.attr("rule"), e.attr("pci_expected")) for e in events]


def test_a_gpu_missing_keeps_the_gpus_after_it_in_their_slots_and_is_reported(hgx: Topology) -> None:
    ident = Identity(hgx)
    ref = complete(hgx)
    assert ident.register(ref, T0) == []
    events = ident.register(without(ref, gpu=3), T0 + timedelta(hours=1))
    assert summary(events) == [("gpu_lost", f"{NODE}-gpu3", "gpu_missing", ref.gpus[3].pci)]  # no moves
    (lost,) = events
    assert (lost.node, lost.source, lost.attr("serial")) == (NODE, "controller", hgx.components[f"{NODE}-gpu3"].serial)
    assert ident.resolve(lost) is lost  # already named with its slot
    # The agent's numbering after the gap: its GPU 3 is the one in slot 4, its guess gpu6 the one in slot 7.
    assert ident.resolve(ev(f"{NODE}-gpu3", gpu="3")).component == f"{NODE}-gpu4"
    assert ident.resolve(ev(f"{NODE}-gpu6")).component == f"{NODE}-gpu7"
    assert ident.resolve(ev(None, gpu="2")).component == f"{NODE}-gpu2"  # before the gap: unchanged
    assert ident.resolve(ev(None, pci=ref.gpus[5].pci)).component == f"{NODE}-gpu5"
    assert ident.resolve(ev(None, pci=ref.gpus[3].pci)).component == f"{NODE}-gpu3"  # the kernel's line for it
    link = ident.resolve(ev(None, gpu="3", nvlink="2"))
    assert (link.component, link.link) == (f"{NODE}-gpu4", f"{NODE}-gpu4~{NODE}-nvsw2")


def test_an_hca_missing_after_a_reboot_keeps_the_later_rails(hgx: Topology) -> None:
    ident = Identity(hgx)
    ref = complete(hgx)
    ident.register(ref, T0)
    events = ident.register(without(ref, hca="mlx5_2"), T0 + timedelta(hours=1))
    assert summary(events) == [("check_failed", f"{NODE}-nic2", "hca_missing", ref.nics[2].pci)]
    assert events[0].attr("check") == "inventory"
    down = ident.resolve(ev(None, EventKind.LINK_DOWN, device="mlx5_2", port="1"))  # now the HCA of slot 3
    assert (down.component, down.link) == (f"{NODE}-nic3", f"{NODE}-nic3~leaf-su1-r3")
    assert ident.resolve(ev(f"{NODE}-nic6", EventKind.LINK_DOWN)).component == f"{NODE}-nic7"
    assert ident.resolve(ev(None, EventKind.AER_UNCORRECTED, pci=ref.nics[2].pci)).component == f"{NODE}-nic2"


def test_each_registration_without_the_unit_reports_it_and_a_restart_keeps_the_slots(hgx: Topology) -> None:
    ident = Identity(hgx)
    ref = complete(hgx)
    gone = without(ref, gpu=3)
    ident.register(ref, T0)
    first = ident.register(gone, T0 + timedelta(hours=1))
    again = ident.register(gone, T0 + timedelta(hours=2))  # the agent started again: still not there
    assert summary(again) == summary(first) and again[0].id != first[0].id
    assert (ident.inventories(), [r.inventory for r in ident.references()]) == ([gone], [ref])  # kept apart
    restarted = Identity(hgx)
    restarted.load(ident.inventories(), ident.references())
    assert restarted.resolve(ev(None, gpu="3")).component == f"{NODE}-gpu4"
    assert summary(restarted.register(gone, T0 + timedelta(hours=3))) == summary(first)
    assert _ref(restarted, NODE) == ref


def test_a_quiet_slot_still_missing_is_not_reported_again_but_a_new_gap_is(hgx: Topology) -> None:
    """``quiet``: the slots of a node put back in service after their gap was reported (the controller's
    judgement): not drained again at every agent restart for the same gap; a second unit gone is news."""
    ident = Identity(hgx)
    ref = complete(hgx)
    ident.register(ref, T0)
    gone, slot = without(ref, gpu=3), f"{NODE}-gpu3"
    assert [e.component for e in ident.register(gone, T0 + timedelta(hours=1), quiet={slot})] == [slot]  # news
    assert ident.register(gone, T0 + timedelta(hours=2), quiet={slot}) == []
    assert [e.component for e in ident.register(gone, T0 + timedelta(hours=3))] == [slot]  # not quiet: told
    restarted = Identity(hgx)  # the controller restarted meanwhile: it knows the gap already
    restarted.load(ident.inventories(), ident.references())
    assert restarted.register(gone, T0 + timedelta(hours=4), quiet={slot}) == []
    worse = without(gone, gpu=5)  # NVML's 5 is slot 6 now
    assert [e.component for e in restarted.register(worse, T0 + timedelta(hours=5), quiet={slot})] == [
        f"{NODE}-gpu6"]


def test_a_storage_hca_beside_the_compute_hcas_does_not_hide_a_missing_one(hgx: Topology) -> None:
    ident = Identity(hgx)
    ref = complete(hgx)
    storage = NicUnit("mlx5_8", pci="0000:e0:00.0", serial="MT-STORAGE")  # nine HCAs, eight NIC slots
    ref = replace(ref, nics=(*ref.nics, storage))
    ident.register(ref, T0)
    gone = without(ref, hca="mlx5_2")  # eight HCAs left: as many as the slots, one fewer than the reference
    events = ident.register(gone, T0 + timedelta(hours=1))
    assert summary(events) == [("check_failed", f"{NODE}-nic2", "hca_missing", ref.nics[2].pci)]  # no moves
    assert ident.resolve(ev(None, EventKind.LINK_DOWN, device="mlx5_2")).component == f"{NODE}-nic3"
    assert _ref(ident, NODE) == ref


def test_a_reference_does_not_place_serials_on_a_restart(hgx: Topology) -> None:
    """A unit that left an incomplete node and went missing elsewhere: the last inventories say where it
    was last seen, not the older reference of the node it left."""
    a, b = NODE, "r02-n03"
    ident = Identity(hgx)
    unit = "1651111111111"  # fitted in a after the topology was written (its serial is not in it)
    ref_a, ref_b = complete(hgx, a), complete(hgx, b)
    ref_a = replace(ref_a, gpus=tuple(replace(g, serial=unit) if g.index == 3 else g for g in ref_a.gpus))
    ident.register(ref_a, T0)
    ident.register(ref_b, T0)
    ident.register(without(ref_a, gpu=3), T0 + timedelta(hours=1))  # it left a ...
    in_b = replace(ref_b, gpus=tuple(replace(g, serial=unit) if g.index == 0 else g for g in ref_b.gpus))
    (moved,) = [e for e in ident.register(in_b, T0 + timedelta(hours=2)) if e.kind is EventKind.MOVED]
    assert dict(moved.attrs)["to"] == "r02-n03-gpu0"
    ident.register(without(in_b, gpu=0), T0 + timedelta(hours=3))  # ... and fell off the bus in b
    restarted = Identity(hgx)
    restarted.load(ident.inventories(), ident.references())
    for who in (ident, restarted):  # reseated in b: no move, for the running controller and a restarted one
        assert [e for e in who.register(in_b, T0 + timedelta(hours=4)) if e.kind is EventKind.MOVED] == []


def test_the_unit_back_makes_the_inventory_complete_again(hgx: Topology, caplog: pytest.LogCaptureFixture) -> None:
    ident = Identity(hgx)
    ref = complete(hgx)
    ident.register(ref, T0)
    ident.register(without(ref, gpu=3), T0 + timedelta(hours=1))
    fixed = replace(ref, gpus=tuple(replace(g, serial="1659999999999") if g.index == 3 else g for g in ref.gpus))
    with caplog.at_level(logging.INFO, logger="gpufleet.controller.identity"):
        assert ident.register(fixed, T0 + timedelta(hours=2)) == []  # a new GPU in slot 3: a replacement
    assert "1659999999999" in caplog.text
    assert ident.resolve(ev(None, gpu="3")).component == f"{NODE}-gpu3"
    assert _ref(ident, NODE) == fixed and (ident.inventories(), ident.references()) == ([fixed], [])


def test_a_unit_swapped_in_while_another_is_missing_is_still_a_move(hgx: Topology) -> None:
    ident = Identity(hgx)
    ref, other = complete(hgx), complete(hgx, "r02-n03")
    ident.register(ref, T0)
    ident.register(other, T0)
    stray = other.gpus[0].serial
    gone = without(ref, gpu=3)
    gone = replace(gone, gpus=tuple(replace(g, serial=stray) if g.index == 4 else g for g in gone.gpus))
    events = ident.register(gone, T0 + timedelta(hours=1))  # NVML index 4 has slot 5's PCI address
    assert [(e.kind.value, dict(e.attrs).get("from"), e.component) for e in events] == [
        ("moved", "r02-n03-gpu0", f"{NODE}-gpu5"), ("gpu_lost", None, f"{NODE}-gpu3")]


def test_a_unit_nothing_places_names_the_node_and_moves_nothing(hgx: Topology,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    ident = Identity(hgx)
    ref = complete(hgx)
    ident.register(ref, T0)
    gone = without(ref, gpu=3)  # and the GPU now numbered 3 answers at an address and serial never seen
    gone = replace(gone, gpus=tuple(replace(g, pci="0000:f0:00.0", serial="1650000000000") if g.index == 3 else g
                                    for g in gone.gpus))
    with caplog.at_level(logging.WARNING, logger="gpufleet.controller.identity"):
        events = ident.register(gone, T0 + timedelta(hours=1))
    assert [e.component for e in events] == [f"{NODE}-gpu3", f"{NODE}-gpu4"]  # neither slot's unit is seen
    assert "gpu3" in caplog.text
    assert ident.resolve(ev(f"{NODE}-gpu3", gpu="3")).component == NODE
    assert ident.resolve(ev(None, gpu="4")).component == f"{NODE}-gpu5"


def test_without_a_reference_the_serials_place_the_units_and_nothing_is_reported(hgx: Topology) -> None:
    ident = Identity(hgx)
    first = without(inventory_of(hgx, NODE), gpu=3)  # no PCI addresses; the topology knows the serials
    assert ident.register(first, T0) == []
    assert ident.resolve(ev(None, gpu="3")).component == f"{NODE}-gpu4"
    assert ident.reference(NODE) is None


def test_without_a_topology_the_reference_is_the_last_inventory_with_every_unit() -> None:
    ident = Identity(None)
    gpus = tuple(GpuUnit(i, serial=f"G{i}", pci=f"0000:{0x18 + i:02x}:00.0") for i in range(4))
    ref = NodeInventory("n1", "C1", gpus, (NicUnit("mlx5_0", pci="0000:30:00.0"),))
    ident.register(ref, T0)
    events = ident.register(without(ref, gpu=1), T0 + timedelta(hours=1))
    assert [(e.kind.value, e.component) for e in events] == [("gpu_lost", "n1-gpu1")]
    e = HealthEvent("x", "n1", EventKind.XID, T0, component="n1-gpu1", code=79, attrs=(("gpu", "1"),))
    assert ident.resolve(e).component == "n1-gpu2"
    restarted = Identity(None)
    restarted.load(ident.inventories(), ident.references())
    assert restarted.resolve(e).component == "n1-gpu2"
    assert [ev.component for ev in restarted.register(without(ref, gpu=1), T0 + timedelta(hours=2))] == ["n1-gpu1"]


HGX1 = generate_hgx(1)


@settings(max_examples=60, deadline=None)
@given(gpus=st.sets(st.integers(0, 7), max_size=8), hcas=st.sets(st.integers(0, 7), max_size=8))
def test_whatever_is_missing_the_rest_keep_their_slots_and_only_the_missing_are_reported(
    gpus: set[int], hcas: set[int],
) -> None:
    ident = Identity(HGX1)
    ref = complete(HGX1)
    ident.register(ref, T0)
    gone = ref
    for g in sorted(gpus, reverse=True):  # renumbered after each: the NVML index the agent now uses
        gone = without(gone, gpu=g)
    for k in sorted(hcas, reverse=True):
        gone = without(gone, hca=f"mlx5_{k}")
    events = ident.register(gone, T0 + timedelta(hours=1))
    assert not [e for e in events if e.kind is EventKind.MOVED]
    assert {e.component for e in events} == {f"{NODE}-gpu{g}" for g in gpus} | {f"{NODE}-nic{k}" for k in hcas}
    kept_gpus = [g for g in range(8) if g not in gpus]
    for index, slot in enumerate(kept_gpus):
        assert ident.resolve(ev(None, gpu=str(index))).component == f"{NODE}-gpu{slot}"
    kept_hcas = [k for k in range(8) if k not in hcas]
    for position, slot in enumerate(kept_hcas):
        assert ident.resolve(ev(None, EventKind.LINK_DOWN, device=f"mlx5_{position}")).component == f"{NODE}-nic{slot}"


def test_a_tray_moved_with_a_gpu_missing_is_placed_by_its_own_reference() -> None:
    nvl = generate_nvl72(2)
    a, b = "r01-ct03", "r02-ct07"
    ident = Identity(nvl)
    own = inventory_of(nvl, a, pci={i: f"0000:{0x18 + 0x20 * i:02x}:00.0" for i in range(4)})
    ident.register(own, T0)  # tray a's reference; slot b never registered one
    here = replace(without(own, gpu=1), node=b)  # tray a now answers at b, its GPU 1 gone
    events = ident.register(here, T0 + timedelta(hours=1))
    assert [(e.kind.value, e.component, dict(e.attrs).get("from")) for e in events] == [
        ("moved", b, a), ("gpu_lost", f"{b}-gpu1", None)]  # the tray's move carries its GPUs: one move
    assert events[1].attr("serial") == own.gpus[1].serial
    assert ident.resolve(HealthEvent("x", b, EventKind.XID, T0, code=13, attrs=(("gpu", "1"),))).component == (
        f"{b}-gpu2")


def test_a_slot_removed_from_the_topology_makes_the_short_node_complete_again() -> None:
    """What an operator does for a node that stays short of a GPU until a maintenance window: take the
    slot out of the topology. The reference taken against the old slots no longer counts; the GPUs keep
    their slots and nothing is reported missing."""
    hgx = generate_hgx(1)
    ident = Identity(hgx)
    ref = complete(hgx)
    ident.register(ref, T0)
    gone = without(ref, gpu=3)
    assert [e.component for e in ident.register(gone, T0 + timedelta(hours=1))] == [f"{NODE}-gpu3"]
    slot = f"{NODE}-gpu3"
    edited = Topology.of([c for c in hgx.components.values() if c.id != slot],
                         [ln for ln in hgx.links.values() if slot not in (ln.a, ln.b)])
    restarted = Identity(edited)  # the controller restarted with the edited topology file
    restarted.load(ident.inventories(), ident.references())
    assert restarted.register(gone, T0 + timedelta(hours=2)) == []
    assert [restarted.resolve(ev(None, gpu=str(i))).component for i in range(7)] == [
        f"{NODE}-gpu{s}" for s in (0, 1, 2, 4, 5, 6, 7)]
    assert _ref(restarted, NODE) == gone  # the reference now: the seven GPUs in the seven slots


def test_a_moved_trays_reference_becomes_its_new_nodes_and_is_kept() -> None:
    """A tray moved with a GPU missing: the second registration (a reboot that did not help) reports the GPU
    again with the tray's own serial, also after a controller restart."""
    nvl = generate_nvl72(2)
    a, b = "r01-ct03", "r02-ct07"
    ident = Identity(nvl)
    own = inventory_of(nvl, a, pci={i: f"0000:{0x18 + 0x20 * i:02x}:00.0" for i in range(4)})
    ident.register(own, T0)
    ident.register(inventory_of(nvl, b, pci={i: f"0000:{0x18 + 0x20 * i:02x}:00.0" for i in range(4)}), T0)
    here = replace(without(own, gpu=1), node=b)
    ident.register(here, T0 + timedelta(hours=1))
    restarted = Identity(nvl)
    restarted.load(ident.inventories(), ident.references())
    for who in (ident, restarted):
        (lost,) = who.register(here, T0 + timedelta(hours=2))
        assert (lost.component, lost.attr("serial")) == (f"{b}-gpu1", own.gpus[1].serial)


def test_a_moved_chassis_brings_its_reference_whatever_the_slot_ids_look_like() -> None:
    """The topology format allows any ids: the same relative slot is the k-th child of the kind."""
    comps = [Component("trayA", K.COMPUTE_TRAY, None, "CH-A"), Component("trayB", K.COMPUTE_TRAY, None, "CH-B")]
    comps += [Component(f"g{i}@{t}", K.GPU, t, f"G{t[-1]}{i}") for t in ("trayA", "trayB") for i in range(4)]
    topo = Topology.of(comps)
    ident = Identity(topo)
    own = NodeInventory("trayA", "CH-A", tuple(GpuUnit(i, serial=f"GA{i}", pci=f"0000:{0x18 + i:02x}:00.0")
                                               for i in range(4)))
    ident.register(own, T0)
    here = replace(without(own, gpu=1), node="trayB")  # tray A answers at B, its GPU 1 gone
    events = ident.register(here, T0 + timedelta(hours=1))
    assert [e.component for e in events if e.kind is EventKind.GPU_LOST] == ["g1@trayB"]
    # (its GPUs, not named after the tray, move with events of their own: as the correlator's inventory
    # carries only what is named after the unit)
    assert [(e.attr("from"), e.component) for e in events if e.kind is EventKind.MOVED] == [
        ("trayA", "trayB"), ("g0@trayA", "g0@trayB"), ("g2@trayA", "g2@trayB"), ("g3@trayA", "g3@trayB")]
    assert ident.resolve(HealthEvent("x", "trayB", EventKind.XID, T0, code=13, attrs=(("gpu", "1"),))).component == (
        "g2@trayB")
