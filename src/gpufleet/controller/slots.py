"""Which slot each unit of a node's inventory sits in, also when a unit is missing from it.

An agent numbers its GPUs by NVML index (PCI bus order) and its HCAs by name; a slot is a position
among the node's GPU or NIC children in the topology (docs/formats.md, "Identities"). While every unit
is there, the k-th unit sits in the k-th slot. When one is missing (a GPU fell off the bus, a node
rebooted without an HCA), every later unit would shift onto the slot before its own: its events would
name the wrong GPU, rail or leaf, and each later serial would look like a move.

So the PCI address, which belongs to the slot and not to the unit, is what names a slot once a
*complete* inventory (at least as many units of the kind as the topology has slots, and as the
reference has when the topology's slots are still those it was taken in) has shown it. That inventory,
with the slot each of its units sat in, is the node's :class:`Reference` (:func:`complete`). A topology
that changed the node's slots (a slot removed for a GPU gone for good) makes it stale: the next complete
inventory against the new slots replaces it. An incomplete kind is placed unit by unit, first rule that
applies:

1. its PCI address in the reference -> the reference's slot at that address (a swapped-in unit keeps
   its slot's address, so its move or replacement is judged as usual);
2. its serial last seen at one of this node's slots of the kind -> that slot (never a move);
3. without a usable reference (none, or one that lacks a PCI address): its own position, the
   complete rule's guess;
4. else no slot: its events name the node, and no move is judged for it.

A slot of the reference whose unit's PCI address the inventory does not report, and which no unit
took, is *missing*: the identity reports it (``Identity.register``).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.fleet import ComponentKind, gpu_slot, nic_slot
from gpufleet.domain.inventory import NodeInventory, parse_inventory


@dataclass(frozen=True, slots=True)
class Reference:
    """A node's last complete inventory and the slot each of its units sat in then, in the inventory's
    order ("" for a unit beyond the node's slots)."""

    inventory: NodeInventory
    gpu_slots: tuple[str, ...]
    nic_slots: tuple[str, ...]

    def moved(self, new: str, slot: Callable[[str], str]) -> Reference:
        """The reference of a chassis that moved to node ``new``: its units in the slots ``slot`` gives for
        the ones they sat in (the same relative place, as the carried units of a move; "" for none)."""
        return Reference(replace(self.inventory, node=new), tuple(slot(s) for s in self.gpu_slots),
                         tuple(slot(s) for s in self.nic_slots))

    def to_json(self) -> dict[str, Any]:
        return {"inventory": self.inventory.to_json(), "gpu_slots": list(self.gpu_slots),
                "nic_slots": list(self.nic_slots)}

    @staticmethod
    def from_json(obj: Any, where: str = "reference") -> Reference:
        """A stored reference; InvalidInput names the field that is not what :meth:`to_json` writes."""
        if not isinstance(obj, dict):
            raise InvalidInput(where, obj, "a JSON object with inventory, gpu_slots and nic_slots")
        inv = parse_inventory(obj.get("inventory"), f"{where}.inventory")
        out = []
        for key, units in (("gpu_slots", inv.gpus), ("nic_slots", inv.nics)):
            names = obj.get(key)
            if not isinstance(names, list) or len(names) != len(units) or not all(isinstance(n, str) for n in names):
                raise InvalidInput(f"{where}.{key}", names, f"a list of {len(units)} slot ids, one per unit")
            out.append(tuple(names))
        return Reference(inv, out[0], out[1])


@dataclass(frozen=True, slots=True)
class Missing:
    """A unit of the node's reference inventory that this inventory lacks."""

    kind: ComponentKind  # GPU or NIC
    slot: str
    pci: str  # its address in the reference
    serial: str  # the serial the reference reported there ("" when none)


@dataclass(frozen=True, slots=True)
class Slots:
    """One node's slots and the inventory's local names for them (positions among the slots)."""

    host: str  # the node's topology id (or its name, without a topology)
    gpus: tuple[str, ...] | None  # GPU slots by position; None without a topology (named by position)
    nics: tuple[str, ...] | None
    gpu_of_pci: Mapping[str, int]
    nic_of_pci: Mapping[str, int]
    nic_of_device: Mapping[str, int]
    switches: tuple[str, ...] = ()  # the node's NVSwitch chips in natural id order (HGX: <node>-nvsw<i>)
    gpu_of_index: Mapping[int, int] | None = None  # NVML index -> position; None: the same number
    nic_of_index: Mapping[int, int] | None = None  # the agent's HCA position -> slot position; None: the same
    missing: tuple[Missing, ...] = ()
    unplaced: tuple[str, ...] = ()  # the units without a slot (NVML index ``gpu3``, HCA name)
    complete: bool = True  # both kinds complete: this inventory is the node's reference

    def gpu(self, i: int) -> str | None:
        """The slot at GPU position ``i``."""
        if self.gpus is None:
            return gpu_slot(self.host, i)
        return self.gpus[i] if i < len(self.gpus) else None

    def nic(self, k: int) -> str | None:
        if self.nics is None:
            return nic_slot(self.host, k)
        return self.nics[k] if k < len(self.nics) else None

    def gpu_at_index(self, index: int) -> str | None:
        """The slot of the GPU the agent numbers ``index`` (NVML); None for a GPU without a slot."""
        if self.gpu_of_index is None:
            return self.gpu(index)
        at = self.gpu_of_index.get(index)
        return None if at is None else self.gpu(at)

    def nic_at_index(self, k: int) -> str | None:
        """The slot of the agent's ``k``-th HCA in natural name order (its ``<node>-nic<k>`` guess)."""
        if self.nic_of_index is None:
            return self.nic(k)
        at = self.nic_of_index.get(k)
        return None if at is None else self.nic(at)

    def nic_named(self, device: str) -> str | None:
        """The slot of HCA ``device`` (``mlx5_3``); None for one the inventory lacks or that has no slot."""
        at = self.nic_of_device.get(device)
        return None if at is None else self.nic(at)


@dataclass(frozen=True, slots=True)
class _Unit:
    key: int | str  # the agent's own name: NVML index or HCA name
    pos: int  # its slot while the kind is complete: the NVML index, the HCA's place in natural name order
    pci: str
    serial: str
    slot: str = ""  # a reference's unit: the slot it sat in


def build(host: str, gpus: tuple[str, ...] | None, nics: tuple[str, ...] | None, switches: tuple[str, ...],
          inv: NodeInventory | None, reference: Reference | None, where: Mapping[str, str]) -> Slots:
    """The slots of node ``host`` for ``inv`` (None: not registered yet), placed by the module's rules;
    ``where`` is each serial's last known slot."""
    if inv is None:
        return Slots(host, gpus, nics, {}, {}, {}, switches)
    g_units, n_units = _units(inv)
    g_ref, n_ref = _units(reference.inventory, reference) if reference is not None else (None, None)
    g_at, g_done, g_missing = _place(g_units, g_ref, gpus, where, lambda i: gpu_slot(host, i))
    n_at, n_done, n_missing = _place(n_units, n_ref, nics, where, lambda k: nic_slot(host, k))
    g_pci = {u.key: u.pci for u in g_units if u.pci}
    n_pci = {u.key: u.pci for u in n_units if u.pci}
    return Slots(  # a missing unit's address still names its slot (the kernel's XID 79 line for it)
        host, gpus, nics,
        gpu_of_pci={g_pci[k]: p for k, p in g_at.items() if k in g_pci} | {m.pci: p for p, _, m in g_missing},
        nic_of_pci={n_pci[k]: p for k, p in n_at.items() if k in n_pci} | {m.pci: p for p, _, m in n_missing},
        nic_of_device={str(k): p for k, p in n_at.items()},
        switches=switches,
        gpu_of_index=None if g_done else {int(k): p for k, p in g_at.items()},
        nic_of_index=None if n_done else {i: n_at[u.key] for i, u in enumerate(n_units) if u.key in n_at},
        missing=tuple(Missing(ComponentKind.GPU, name, m.pci, m.serial) for _, name, m in g_missing)
        + tuple(Missing(ComponentKind.NIC, name, m.pci, m.serial) for _, name, m in n_missing),
        unplaced=tuple(f"gpu{u.key}" for u in g_units if u.key not in g_at)
        + tuple(str(u.key) for u in n_units if u.key not in n_at),
        complete=g_done and n_done,
    )


def reference_of(slots: Slots, inv: NodeInventory) -> Reference:
    """``inv``, complete, as the node's reference: each unit with the slot it sits in."""
    return Reference(inv, tuple(slots.gpu_at_index(g.index) or "" for g in inv.gpus),
                     tuple(slots.nic_named(n.device) or "" for n in inv.nics))


def _units(inv: NodeInventory, ref: Reference | None = None) -> tuple[list[_Unit], list[_Unit]]:
    gs = ref.gpu_slots if ref is not None else ("",) * len(inv.gpus)
    ns = ref.nic_slots if ref is not None else ("",) * len(inv.nics)
    return ([_Unit(g.index, g.index, g.pci, g.serial, s) for g, s in zip(inv.gpus, gs, strict=True)],
            [_Unit(n.device, k, n.pci, n.serial, s) for k, (n, s) in enumerate(zip(inv.nics, ns, strict=True))])


def complete(count: int, slots: tuple[str, ...] | None, reference: list[_Unit] | None) -> bool:
    """Whether ``count`` units of a kind are all of them: at least the topology's slots and at least the
    reference's units (a node with a storage HCA beside its eight compute HCAs, eight NIC slots, is not
    complete with a compute HCA gone). ``reference``: None when there is none or it is stale."""
    if slots is not None and count < len(slots):
        return False
    return reference is None or count >= len(reference)


def _place(units: list[_Unit], ref: list[_Unit] | None, slots: tuple[str, ...] | None, where: Mapping[str, str],
           name: Callable[[int], str]) -> tuple[dict[int | str, int], bool, list[tuple[int, str, _Unit]]]:
    """Each unit's position, whether the kind is complete, and the reference's units now missing (with
    their positions)."""
    # A reference taken while the node had other slots (the topology changed them) counts nothing.
    fits = ref is not None and (slots is None or tuple(u.slot for u in ref if u.slot) == slots)
    if complete(len(units), slots, ref if fits else None):
        return {u.key: u.pos for u in units}, True, []
    size = len(slots) if slots is not None else len(ref or units)
    slot_names = slots if slots is not None else tuple(name(p) for p in range(size))
    position = {s: p for p, s in enumerate(slot_names)}
    usable = ref is not None and all(u.pci for u in ref)
    ref_at = {u.pci: position[u.slot] for u in ref or () if u.pci and u.slot in position}
    at: dict[int | str, int] = {}
    taken: set[int] = set()

    def take(u: _Unit, p: int | None) -> None:
        if p is not None and p not in taken and u.key not in at:
            at[u.key] = p
            taken.add(p)

    for u in units:  # 1. the PCI address names the slot
        take(u, ref_at.get(u.pci) if u.pci else None)
    for u in units:  # 2. the serial was last seen at one of these slots
        take(u, position.get(where.get(u.serial, "")) if u.serial else None)
    if not usable:
        for u in units:  # 3. the positional guess
            if u.pos < size:
                take(u, u.pos)
    reported = {u.pci for u in units if u.pci}
    missing = [(position[u.slot], u.slot, u) for u in ref or ()
               if usable and u.slot in position and position[u.slot] not in taken and u.pci not in reported]
    return at, False, missing
