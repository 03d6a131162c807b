"""From an explanation to what an operator reads: the recommended action and the reason."""

from __future__ import annotations

from gpufleet.correlate.explain import Explanation
from gpufleet.correlate.inventory import MoveRecord
from gpufleet.correlate.model import Basis, SuspectAction
from gpufleet.correlate.symptoms import Symptom
from gpufleet.domain.catalog import Action


def action_for(ex: Explanation, kind: str, finding: Basis, confidence: float, emit: float) -> SuspectAction:
    """The action for a suspect of ``kind`` (component kind, or link kind for a link).

    Below ``emit`` confidence: observe. A cable, or a pattern that stayed at its slot: check the
    cabling. A pattern that followed its unit: drain and replace the unit. Spine/core: isolate (the
    fat-tree routes around it, no node drains). Leaf, NVSwitch, switch tray, NIC: drain the nodes
    behind and replace. A GPU: the catalog's action for its events (replace > reboot > reset).
    Otherwise drain and inspect.
    """
    if confidence < emit:
        return SuspectAction.OBSERVE
    if finding is Basis.STAYS_AT_SLOT or ex.kind == "link":
        return SuspectAction.CHECK_CABLING
    if finding is Basis.FOLLOWS_SERIAL:
        return SuspectAction.DRAIN_AND_REPLACE
    if kind in ("spine_switch", "core_switch"):
        return SuspectAction.ISOLATE_SWITCH
    if kind in ("leaf_switch", "nvswitch", "switch_tray", "nic"):
        return SuspectAction.DRAIN_AND_REPLACE
    if kind == "gpu":
        actions = {s.action for s in ex.symptoms if isinstance(s, Symptom)}
        if Action.REPLACE in actions:
            return SuspectAction.DRAIN_AND_REPLACE
        if actions <= {Action.RESET_GPU}:
            return SuspectAction.RESET_GPU
        if Action.REBOOT in actions and actions <= {Action.REBOOT, Action.RESET_GPU}:
            return SuspectAction.REBOOT
    return SuspectAction.DRAIN_AND_INSPECT


def reason_for(ex: Explanation, finding: Basis, rec: MoveRecord | None) -> str:
    """One sentence: how many symptoms from whom share what; and the move history when it decided."""
    reporters = sorted({s.reporter for s in ex.symptoms})
    shown = ", ".join(reporters[:4]) + (", ..." if len(reporters) > 4 else "")
    base = f"{len(ex.symptoms)} symptom(s) from {len(reporters)} reporter(s) ({shown}) share {ex.candidate}"
    if finding is Basis.FOLLOWS_SERIAL and rec is not None:
        return f"{base}; the pattern followed unit {rec.serial} from {rec.from_slot} to {rec.to_slot}"
    if finding is Basis.STAYS_AT_SLOT and rec is not None:
        return (
            f"{base}; the pattern stayed at slot {rec.from_slot} after unit {rec.serial} was moved "
            f"to {rec.to_slot}: suspect the slot's cabling/port"
        )
    if finding is Basis.DEGRADING:
        return f"{base}; weak signals only, no fault yet: a degrading part (drain at the next checkpoint)"
    return base
