"""Which slot each unit of a node's inventory sits in, also when a unit is missing from it.

An agent numbers its GPUs by NVML index (PCI bus order) and its HCAs by name; a slot is a position
among the node's GPU or NIC children in the topology (docs/formats.md, "Identities"). While every unit
is there, the k-th unit sits in the k-th slot. When one is missing (a GPU fell off the bus, a node
rebooted without an HCA), every later unit would shift onto the slot before its own: its events would
name the wrong GPU, rail or leaf, and each later serial would look like a move.

So the PCI address, which belongs to the slot and not to the unit, is what names a slot once a
*complete* inventory (at least as many units of the kind as the topology has slots; without a
topology, at least as many as the reference) has shown it. That inventory is the node's *reference*
(:func:`complete`). An incomplete kind is placed unit by unit, first rule that applies:

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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpufleet.domain.fleet import ComponentKind, gpu_slot, nic_slot
from gpufleet.domain.inventory import NodeInventory


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


def build(host: str, gpus: tuple[str, ...] | None, nics: tuple[str, ...] | None, switches: tuple[str, ...],
          inv: NodeInventory | None, reference: NodeInventory | None, where: Mapping[str, str]) -> Slots:
    """The slots of node ``host`` for ``inv`` (None: not registered yet), placed by the module's rules;
    ``where`` is each serial's last known slot."""
    if inv is None:
        return Slots(host, gpus, nics, {}, {}, {}, switches)
    g_units, n_units = _units(inv)
    g_ref, n_ref = _units(reference) if reference is not None else (None, None)
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


def _units(inv: NodeInventory) -> tuple[list[_Unit], list[_Unit]]:
    return ([_Unit(g.index, g.index, g.pci, g.serial) for g in inv.gpus],
            [_Unit(n.device, k, n.pci, n.serial) for k, n in enumerate(inv.nics)])


def complete(count: int, slots: tuple[str, ...] | None, reference: Sequence[object] | None) -> bool:
    """Whether ``count`` units of a kind are all of them: at least the topology's slots and at least the
    reference's units (a node with a storage HCA beside its eight compute HCAs, eight NIC slots, is not
    complete with a compute HCA gone)."""
    if slots is not None and count < len(slots):
        return False
    return reference is None or count >= len(reference)


def _place(units: list[_Unit], ref: list[_Unit] | None, slots: tuple[str, ...] | None, where: Mapping[str, str],
           name: Callable[[int], str]) -> tuple[dict[int | str, int], bool, list[tuple[int, str, _Unit]]]:
    """Each unit's position, whether the kind is complete, and the reference's units now missing (with
    their positions)."""
    if complete(len(units), slots, ref):
        return {u.key: u.pos for u in units}, True, []
    size = len(slots) if slots is not None else len(ref or units)
    slot_names = slots if slots is not None else tuple(name(p) for p in range(size))
    position = {s: p for p, s in enumerate(slot_names)}
    usable = ref is not None and all(u.pci for u in ref)
    ref_at = {u.pci: u.pos for u in ref or () if u.pci and u.pos < size}
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
    missing = [(u.pos, slot_names[u.pos], u) for u in ref or ()
               if usable and u.pos < size and u.pos not in taken and u.pci not in reported]
    return at, False, missing
