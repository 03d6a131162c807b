"""Topology-native identities: an agent's local names mapped onto topology ids, and hardware moves.

An agent names what it saw locally, in the event's ``attrs``: ``gpu`` (NVML index), ``pci``
(``dddd:bb:dd.f``), ``device`` (InfiniBand HCA, ``mlx5_3``), ``port`` (HCA port number), ``nvlink``
(NVLink number on that GPU). Its ``component`` is a local guess (``<node>-gpu<i>``, ``<node>-nic<k>``,
``<node>``) and its ``link`` may be a local name (``<node>-gpu2~nvlink5``, ``<node>-gpu2~pcie``).
:meth:`Identity.resolve` names the same event with topology ids, by these rules (docs/formats.md,
"Identities"):

* The node's topology id is the component whose id is the node name (kind ``node`` or
  ``compute_tray``). An event of a node the topology does not have is returned unchanged.
* Component, first rule that applies: a ``pci`` of one of the inventory's GPUs or NICs -> that unit;
  ``gpu`` i -> the node's i-th GPU child in natural id order (``gpu2`` before ``gpu10``); ``device``
  -> the NIC at that HCA's position among the inventory's HCAs in natural name order (``mlx5_2``
  before ``mlx5_10``), mapped onto the node's NIC children in natural id order; a ``pci`` that matches
  nothing on the node -> the node (an XID of an unknown PCI address is still the node's); else the
  agent's guess: a topology id stays, ``<node>-gpu<i>`` / ``<node>-nic<k>`` map as above, anything
  else (or none) -> the node. A GPU or NIC number the topology does not have -> the node.
  Before all of these, an SXid's ``nvswitch`` N (``nvidia-nvswitch<N>``) names the node's N-th
  NVSwitch child in natural id order (HGX nodes; an NVL72 compute tray has none, so it falls through).
* Link: a topology link id stays. An event with ``device`` on a NIC names the NIC's ``port``-th link
  of kind ``ib`` in topology order (the first without ``port``); ``nvlink`` N on a GPU names the GPU's
  N-th (0-based) link of kind ``nvlink``; ``peer_gpu`` i on an NVSwitch (the GPU on the far end of the
  SXid's port, from ``nvidia-smi nvlink -R``) names the link between that switch and the node's GPU i.
  Out of range, or anything else (``~pcie``): no link. The attrs are kept as sent.
* Without a topology, the same rules name ``<node>``, ``<node>-gpu<i>``, ``<node>-nic<k>`` (an
  unknown component is kept) and no link.

Moves: which serial sits in which slot is seeded from the topology's serials, then from the stored
inventories (:meth:`Identity.load`, which emits nothing). :meth:`Identity.register` compares each
reported unit (chassis, GPUs, NICs) with what was last known: a serial last seen at another slot is a
``moved`` event (``attrs`` serial/from/to, the correlator's contract); a serial never seen is a
replacement (logged, no event). A chassis that moved carries its GPUs and NICs to the same relative
positions, as the correlator's inventory does, so only the chassis move is emitted for them; a GPU whose
serial was last seen outside the old chassis moved on its own and gets its own event. A serial reported
twice in one inventory (a dual-port HCA's board) names no slot and is ignored.

Missing units (``controller/slots.py``, decision 0133): the rules above count units, and a GPU or HCA
missing from an inventory would shift every later one onto the slot before its own. So the node's last
complete inventory is its *reference*, whose PCI addresses name the slots of an incomplete one (the
counts ``gpu`` i, ``device`` and the guesses are mapped through them); a reference unit the inventory
lacks is reported by :meth:`register` (when it goes missing, and with ``again`` at each registration):
``gpu_lost`` rule ``gpu_missing`` for a GPU, ``check_failed`` rule ``hca_missing`` for an HCA, named
with the slot. Since names depend on the numbering of now, events are named once, at ingest.

Pure: no I/O, no clock (``now`` is passed in).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace
from datetime import datetime

from gpufleet.controller import slots as slotmap
from gpufleet.controller.slots import Missing, Reference, Slots
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.fleet import ComponentKind
from gpufleet.domain.inventory import NodeInventory
from gpufleet.domain.topology import HOST_KINDS, Topology

log = logging.getLogger(__name__)

GPU_MISSING, HCA_MISSING = "gpu_missing", "hca_missing"  # rules_catalog.csv judges them
MISSING_RULES = frozenset({GPU_MISSING, HCA_MISSING})
_SEEDED = HOST_KINDS | {ComponentKind.GPU, ComponentKind.NIC}  # the units an inventory reports


class Identity:
    """Maps agents' local names onto topology ids and notices units that changed slots."""

    def __init__(self, topology: Topology | None) -> None:
        self._topo = topology
        self._inventories: dict[str, NodeInventory] = {}
        self._references: dict[str, Reference] = {}  # per node, its last complete inventory (slots.py)
        self._missing: dict[str, frozenset[str]] = {}  # per node, the slots its last inventory lacked
        self._slots: dict[str, Slots | None] = {}  # per node, built on first use; None: not in the topology
        self._lanes: dict[tuple[str, str], tuple[str, ...]] = {}  # (component, link kind) -> link ids
        self._at: dict[str, str] = {}  # slot -> serial last seen there
        self._where: dict[str, str] = {}  # serial -> slot last seen at (kept for a displaced unit)
        self.load(())

    # -- inventories ------------------------------------------------------------------------------

    def load(self, inventories: Iterable[NodeInventory], references: Iterable[Reference] = ()) -> None:
        """Start over from the topology's serials, the stored ``references`` (each node's last complete
        inventory, where it is not its last one) and the stored ``inventories`` (oldest first), as after
        a restart (also after a failed write, to forget what was not stored); emits nothing. A reference
        names slots only: the serials are placed from the last inventories, which are newer."""
        stored, refs = list(inventories), list(references)  # may be our own inventories(), references()
        self._inventories.clear()
        self._references = {r.inventory.node: r for r in refs}
        self._missing.clear()
        self._slots.clear()
        self._at.clear()
        self._where.clear()
        if self._topo is not None:
            for c in self._topo.components.values():
                if c.serial and c.kind in _SEEDED:
                    self._place(c.serial, c.id)
        for inv in stored:
            slots = self._remember(inv)
            if slots is not None:
                for slot, serial in _units(slots, inv):
                    self._place(serial, slot)

    def register(self, inv: NodeInventory, now: datetime, *, quiet: Collection[str] = ()) -> list[HealthEvent]:
        """Remember ``inv`` and return the events it implies: the ``moved`` events (none for a repeat),
        then one event per unit of the node's reference inventory that ``inv`` lacks (an agent registers
        on every start: a reboot that did not bring a GPU back says so), except for the slots in
        ``quiet`` whose unit the node's last registered inventory lacked already (the caller's: a node
        put back into service after the gap was reported)."""
        before = self._missing.get(inv.node, frozenset())
        slots = self._remember(inv)
        if slots is None:
            log.info("%s: inventory of a node the topology does not have; no moves judged", inv.node)
            return []
        gone = [m for m in slots.missing if not (m.slot in before and m.slot in quiet)]
        if len(gone) < len(slots.missing):
            log.info("%s: %d unit(s) still missing, not reported again (back in service since): %s", inv.node,
                     len(slots.missing) - len(gone), ", ".join(m.slot for m in slots.missing if m not in gone))
        return self._moves(inv, slots, now) + [_missing(inv.node, m, now) for m in gone]

    def missing(self, node: str, now: datetime) -> list[HealthEvent]:
        """The events :meth:`register` gives for the units ``node``'s last inventory lacks, told again now."""
        slots = self._slots_of(node) if node in self._inventories else None
        return [_missing(node, m, now) for m in slots.missing] if slots is not None else []

    def gaps(self, node: str) -> frozenset[str]:
        """The slots whose unit ``node``'s last registered inventory lacks (of its reference)."""
        return self._missing.get(node, frozenset())

    def short(self) -> list[str]:
        """The nodes whose last inventory lacks a unit of their reference."""
        return [n for n, gaps in self._missing.items() if gaps]

    def _moves(self, inv: NodeInventory, slots: Slots, now: datetime) -> list[HealthEvent]:
        moved: list[HealthEvent] = []
        carried: list[tuple[str, str]] = []  # (from, to) of the chassis moved in this report
        replaced: list[str] = []
        for slot, serial in _units(slots, inv):
            last = self._where.get(serial)
            if last == slot:
                self._at[slot] = serial  # back where it was last seen (a unit it displaced is gone again)
                continue
            if last is None:
                before = self._at.get(slot)
                if before is not None:
                    replaced.append(f"{slot}: {before} -> {serial}")
            # carried: at the same relative place, named by the chassis's id as the correlator's inventory
            # carries units (a unit named otherwise moves on its own, with its own event)
            elif not any(last.startswith(f) and slot == t + last[len(f):] for f, t in carried):
                log.info("%s: unit %s moved from %s to %s", inv.node, serial, last, slot)
                moved.append(_moved(inv.node, serial, last, slot, now))
                if slot == slots.host:
                    carried.append((last, slot))
            self._place(serial, slot)
        if replaced:
            log.info("%s: %d unit(s) replaced: %s", inv.node, len(replaced), "; ".join(replaced))
        if slots.unplaced:
            log.warning("%s: %d unit(s) of an incomplete inventory have no slot (their events name the node, no "
                        "move is judged for them): %s", inv.node, len(slots.unplaced), ", ".join(slots.unplaced))
        return moved

    def inventories(self) -> list[NodeInventory]:
        """The inventories remembered, least recently registered first (what :meth:`load` takes)."""
        return list(self._inventories.values())

    def references(self) -> list[Reference]:
        """Each node's reference where it is not its last inventory (what :meth:`load` takes beside them)."""
        return [r for node, r in self._references.items() if self._inventories.get(node) is not r.inventory]

    def placement(self, node: str) -> tuple[dict[int, str | None], dict[str, str | None], tuple[Missing, ...]]:
        """Where the units of ``node``'s last inventory sit (slot per NVML index, per HCA name; None: no
        slot) and the units of its reference it lacks: what the node page shows."""
        slots, inv = self._slots_of(node), self._inventories.get(node)
        if slots is None or inv is None:
            return {}, {}, ()
        return ({g.index: slots.gpu_at_index(g.index) for g in inv.gpus},
                {n.device: slots.nic_named(n.device) for n in inv.nics}, slots.missing)

    def reference(self, node: str) -> Reference | None:
        """The node's last complete inventory, whose PCI addresses name its slots (controller/slots.py)."""
        return self._references.get(node)

    def node_component(self, node: str) -> str | None:
        """The node's topology id (its own name when the topology has it as a node or tray), else None."""
        if self._topo is None:
            return None
        comp = self._topo.get(node)
        return node if comp is not None and comp.kind in HOST_KINDS else None

    # -- events -----------------------------------------------------------------------------------

    def resolve(self, e: HealthEvent) -> HealthEvent:
        """``e`` named with topology ids (see the module docstring); unchanged for an unknown node."""
        if e.kind is EventKind.MOVED or (e.source == "controller" and e.attr("rule") in MISSING_RULES):
            return e  # named with slots already (by register)
        slots = self._slots_of(e.node)
        if slots is None:
            return e
        attrs = dict(e.attrs)
        component = self._component(slots, e.component, attrs)
        link = self._link(component, e.link, attrs)
        if component == e.component and link == e.link:
            return e
        return replace(e, component=component, link=link)

    def _component(self, slots: Slots, guess: str | None, attrs: Mapping[str, str]) -> str:
        switch = _number(attrs.get("nvswitch"))
        if switch is not None and switch < len(slots.switches):  # an SXid of nvidia-nvswitch<N>
            return slots.switches[switch]
        pci = attrs.get("pci", "").lower()
        if pci in slots.gpu_of_pci:
            return slots.gpu(slots.gpu_of_pci[pci]) or slots.host
        if pci in slots.nic_of_pci:
            return slots.nic(slots.nic_of_pci[pci]) or slots.host
        gpu = _number(attrs.get("gpu"))
        if gpu is not None:
            return slots.gpu_at_index(gpu) or slots.host
        device = attrs.get("device")
        if device is not None and device in slots.nic_of_device:
            return slots.nic_named(device) or slots.host
        # A PCI address the node's registered inventory does not have names the node itself; before the
        # inventory is registered, the agent's own guess (its GPU slot name) stands.
        if (pci and (slots.gpu_of_pci or slots.nic_of_pci)) or guess is None or guess == slots.host:
            return slots.host
        local = None  # the agent's own <node>-gpu<i> / <node>-nic<k>: i, k count what it sees
        for tag, pick, shifted in (("-gpu", slots.gpu_at_index, slots.gpu_of_index is not None),
                                   ("-nic", slots.nic_at_index, slots.nic_of_index is not None)):
            head, sep, tail = guess.rpartition(tag)
            if sep and head == slots.host and (n := _number(tail)) is not None:
                local = (pick, n, shifted)
        # A topology id stays, unless a unit missing from the inventory shifts the agent's numbering.
        if self._topo is not None and guess in self._topo.components and not (local and local[2]):
            return guess
        if local is not None:
            return local[0](local[1]) or slots.host
        return slots.host if self._topo is not None else guess

    def _link(self, component: str, link: str | None, attrs: Mapping[str, str]) -> str | None:
        topo = self._topo
        if topo is None:
            return None
        if link is not None and link in topo.links:
            return link
        kind = topo.components[component].kind if component in topo.components else None
        if kind is ComponentKind.NVSWITCH and "peer_gpu" in attrs:  # the switch port's far end
            gpu = topo.components[component].parent
            gpus = topo.children_of_kind(gpu, ComponentKind.GPU) if gpu is not None else ()
            n = _number(attrs["peer_gpu"])
            if n is None or n >= len(gpus):
                return None
            return next((i for i in self._links(gpus[n], "nvlink") if component in (topo.links[i].a, topo.links[i].b)),
                        None)
        if kind is ComponentKind.GPU and "nvlink" in attrs:
            n = _number(attrs["nvlink"])
            lanes = self._links(component, "nvlink")
        elif kind is ComponentKind.NIC and "device" in attrs:
            port = _number(attrs.get("port"))
            n = 0 if port is None else port - 1
            lanes = self._links(component, "ib")
        else:
            return None
        return lanes[n] if n is not None and 0 <= n < len(lanes) else None

    def _links(self, component: str, kind: str) -> tuple[str, ...]:
        key = (component, kind)
        lanes = self._lanes.get(key)
        if lanes is None:
            assert self._topo is not None
            links = self._topo.links
            lanes = self._lanes[key] = tuple(i for i in self._topo.links_of(component) if links[i].kind == kind)
        return lanes

    # -- internals --------------------------------------------------------------------------------

    def _remember(self, inv: NodeInventory) -> Slots | None:
        self._inventories.pop(inv.node, None)  # re-inserted last: the dict is in registration order
        self._inventories[inv.node] = inv
        self._slots.pop(inv.node, None)
        own = self._references.get(inv.node)
        if inv.serial and (own is None or own.inventory.serial != inv.serial) \
                and (came := self._where.get(inv.serial)) not in (None, inv.node):
            theirs = self._references.get(came or "")
            if theirs is not None and theirs.inventory.serial == inv.serial:
                # A chassis moved here brings its reference: its units at the same relative slots.
                self._references[inv.node] = theirs.moved(inv.node, self._relative(came or "", inv.node))
        slots = self._slots_of(inv.node)
        if slots is not None and slots.complete:
            self._references[inv.node] = slotmap.reference_of(slots, inv)
        self._missing[inv.node] = frozenset(m.slot for m in slots.missing) if slots is not None else frozenset()
        return slots

    def _relative(self, old: str, new: str) -> Callable[[str], str]:
        """A GPU or NIC slot of node ``old`` -> the slot at the same place in node ``new`` ("" for none): the
        k-th child of the kind in natural id order; without a topology, by name (``<old>-gpu2`` ->
        ``<new>-gpu2``)."""
        topo = self._topo
        if topo is None:
            return lambda s: new + s[len(old):] if s.startswith(old + "-") else ""
        same: dict[str, str] = {}
        for kind in (ComponentKind.GPU, ComponentKind.NIC):
            same.update(zip(topo.children_of_kind(old, kind), topo.children_of_kind(new, kind), strict=False))
        return lambda s: same.get(s, "")

    def _slots_of(self, node: str) -> Slots | None:
        if node in self._slots:
            return self._slots[node]
        inv = self._inventories.get(node)
        ref = self._references.get(node)
        slots: Slots | None
        if self._topo is None:
            slots = slotmap.build(node, None, None, (), inv, ref, self._where)
        elif self.node_component(node) is None:
            slots = None
        else:
            kids = self._topo.children_of_kind
            slots = slotmap.build(node, kids(node, ComponentKind.GPU), kids(node, ComponentKind.NIC),
                                  kids(node, ComponentKind.NVSWITCH), inv, ref, self._where)
        self._slots[node] = slots
        return slots

    def _place(self, serial: str, slot: str) -> None:
        """``serial`` is at ``slot`` now; its old slot is empty. A unit it displaced keeps its last slot
        (``_where``), so that when it turns up elsewhere that is a move, not a new unit."""
        last = self._where.get(serial)
        if last is not None and last != slot and self._at.get(last) == serial:
            del self._at[last]
        self._where[serial] = slot
        self._at[slot] = serial


def _units(slots: Slots, inv: NodeInventory) -> list[tuple[str, str]]:
    """(slot, serial) of every reported unit with a serial of its own and a slot, the chassis first."""
    units: list[tuple[str, str | None]] = [(inv.serial, slots.host)]
    units += [(g.serial, slots.gpu_at_index(g.index)) for g in inv.gpus]
    units += [(n.serial, slots.nic_named(n.device)) for n in inv.nics]
    counts: dict[str, int] = {}
    for serial, _ in units:
        counts[serial] = counts.get(serial, 0) + 1
    return [(slot, serial) for serial, slot in units if serial and slot is not None and counts[serial] == 1]


def _moved(node: str, serial: str, src: str, dst: str, now: datetime) -> HealthEvent:
    return HealthEvent(
        id=f"moved:{serial}:{src}:{dst}:{now.isoformat()}",
        node=node,
        kind=EventKind.MOVED,
        time=now,
        component=dst,
        message=f"unit {serial} moved from {src} to {dst}",
        source="controller",
        attrs=(("from", src), ("serial", serial), ("to", dst)),
    )


def _missing(node: str, m: Missing, now: datetime) -> HealthEvent:
    gpu = m.kind is ComponentKind.GPU
    what = "GPU" if gpu else "HCA"
    return HealthEvent(
        id=f"missing:{m.slot}:{now.isoformat()}",
        node=node,
        kind=EventKind.GPU_LOST if gpu else EventKind.CHECK_FAILED,
        time=now,
        component=m.slot,
        message=f"{what} {m.slot} (PCI {m.pci}{f', serial {m.serial}' if m.serial else ''}) is missing from the "
                "inventory the node's agent registered",
        source="controller",
        attrs=(("check", "inventory"), ("pci_expected", m.pci), ("rule", GPU_MISSING if gpu else HCA_MISSING),
               ("serial", m.serial)),
    )


def _number(text: str | None) -> int | None:
    return int(text) if text is not None and text.isascii() and text.isdigit() else None
