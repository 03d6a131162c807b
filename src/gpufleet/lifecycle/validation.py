"""Which validation a node gets before it returns to service: the one place it is chosen. Pure.

============================================================  ==========================================
situation                                                     validation
============================================================  ==========================================
new node, or hardware people replaced and sent to burn-in     ``burnin`` (the suite plus a sustained soak)
after a GPU reset or a fabric-manager restart                 ``quick``
after a reboot                                                ``full``
after people repaired it (``repair-complete``, ``resume``)    ``full`` (a part swap, a reseat, a recable)
the fault that took it out was on the fabric                  ``multinode``: paired with known-good nodes
============================================================  ==========================================

The level of the first four is fixed when the ``validate`` action is planned (:func:`level_after`).
Pairing is decided when the validation starts (:func:`plan_validation`), from the fault that took
the node out (:func:`is_fabric`): a link event (InfiniBand port, NVLink link), an NVSwitch (SXID)
event, a failed multi-node check, or a correlator verdict on a switch or cable (whose evidence is
such link events). A burn-in is never replaced by pairing: new hardware gets its soak.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from gpufleet.domain.events import LINK_KINDS, EventKind, HealthEvent
from gpufleet.lifecycle.repair import RepairStep


class Situation(StrEnum):
    """How a node came to need validation, where it is not a repair step."""

    BURN_IN = "burn_in"  # a new node (auto_burn_in, POST /v1/nodes/{node}/burn-in)
    PEOPLE = "people"  # people repaired it: repair-complete, or resume of a drained node


QUICK, FULL, BURNIN, MULTINODE = "quick", "full", "burnin", "multinode"
LEVEL_AFTER: Mapping[RepairStep | Situation, str] = {
    Situation.BURN_IN: BURNIN,
    RepairStep.GPU_RESET: QUICK,
    RepairStep.RESTART_FABRIC_MANAGER: QUICK,
    RepairStep.REBOOT: FULL,
    RepairStep.POWER_CYCLE: FULL,
    Situation.PEOPLE: FULL,
}
# Failed checks that measured the fabric between nodes (gpufleet.checks.multinode).
FABRIC_CHECKS = frozenset({"multinode_pair", "multinode_link"})


def level_after(what: RepairStep | Situation) -> str:
    """The validation level after a repair step that worked, or for a situation."""
    return LEVEL_AFTER[what]


def is_fabric(events: Iterable[HealthEvent]) -> bool:
    """Whether the evidence for a node's fault points at the fabric (see the module docstring)."""
    for e in events:
        if e.kind == EventKind.SXID or (e.kind in LINK_KINDS and not dict(e.attrs).get("rule", "").startswith("pcie")):
            return True  # (a PCIe link is the GPU's slot, not the fabric)
        if e.kind == EventKind.CHECK_FAILED and dict(e.attrs).get("check") in FABRIC_CHECKS:
            return True
    return False


@dataclass(frozen=True, slots=True)
class ValidationPlan:
    level: str
    partners: int = 0  # known-good nodes to pair the node with (0: a single-node validation)


def plan_validation(level: str, *, fabric: bool, partners: int) -> ValidationPlan:
    """The validation to run for a planned ``level``: a fabric fault is validated by pairing the node
    with ``partners`` known-good nodes (0 = pairing off), except a burn-in."""
    if fabric and partners > 0 and level != BURNIN:
        return ValidationPlan(MULTINODE, partners)
    return ValidationPlan(level)
