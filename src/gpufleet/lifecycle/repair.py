"""The repair escalation ladder: which repair step a node in ``repair`` gets next.

Pure: a function of the fault being repaired, the node's past repair attempts and the time.

* **The ladder** comes from the catalog's recommended action for the fault (``Action``):
  ``reset_gpu`` -> GPU reset, then reboot, then reboot; ``reboot`` -> reboot, reboot; an NVSwitch fault
  (``sxid``) with ``reboot`` -> fabric manager restart first; anything else (``replace``,
  ``drain_and_inspect``, ``check_cabling``, ``contact_support``, an operator's drain) -> a ticket at once:
  software cannot fix it. Each attempt at the same fault within ``reboot_window`` (successful or not:
  a fault that returns after a "successful" reset means the reset did not fix it) moves one rung up;
  past the top rung the node goes to people (``ticket``).
* **Power cycle.** With a BMC for the node (``bmc=True``: Redfish, docs/bmc.md) the last reboot rung
  of each ladder becomes a BMC power cycle: reset -> reboot -> power cycle -> ticket. A power cycle
  also works on a hung host whose agent cannot reboot it, and a cold cycle clears states a warm
  reboot keeps (a GPU fallen off the bus). It counts as a reboot for ``reboot_limit``.
* **Reboot limit.** ``reboot_limit`` reboots for the same fault within ``reboot_window`` (default 2 in
  7 days) -> hardware ticket, whatever rung the ladder is on.
* **Lemon node.** ``lemon_repairs`` repair attempts of any fault within ``lemon_window`` (default 4 in
  30 days) -> a ticket recommending retirement (the controller audits it; a person decides).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from gpufleet.domain.catalog import Action
from gpufleet.domain.durations import format_duration
from gpufleet.lifecycle.config import PolicyConfig


class RepairStep(StrEnum):
    GPU_RESET = "gpu_reset"  # the node's agent resets its GPUs (only when no process holds one)
    RESTART_FABRIC_MANAGER = "restart_fabric_manager"  # the node's agent restarts nvidia-fabricmanager
    REBOOT = "reboot"  # the node's agent reboots the host
    POWER_CYCLE = "power_cycle"  # the node's BMC (Redfish) cycles its power: out of band
    TICKET = "ticket"  # hand the node to people (webhook); terminal for automation


# Steps the node's agent carries out (the agent command channel); the rest go elsewhere.
AGENT_STEPS = frozenset({RepairStep.GPU_RESET, RepairStep.RESTART_FABRIC_MANAGER, RepairStep.REBOOT})
BMC_STEPS = frozenset({RepairStep.POWER_CYCLE})
# Steps that restart the host: what ``reboot_limit`` counts.
REBOOT_STEPS = frozenset({RepairStep.REBOOT, RepairStep.POWER_CYCLE})

S = RepairStep
LADDERS: Mapping[Action, tuple[RepairStep, ...]] = {
    Action.RESET_GPU: (S.GPU_RESET, S.REBOOT, S.REBOOT),
    Action.REBOOT: (S.REBOOT, S.REBOOT),
    Action.RESTART_APP: (S.GPU_RESET, S.REBOOT),  # the app crashed the GPU and it stayed bad
}
FABRIC_LADDER = (S.RESTART_FABRIC_MANAGER, S.REBOOT, S.REBOOT)


@dataclass(frozen=True, slots=True)
class Fault:
    """What a repair is for: ``key`` names the fault across attempts (``xid:79``, ``sxid:12028``,
    ``check_failed``); ``action`` is the catalog's recommendation for it."""

    key: str
    action: Action
    text: str = ""
    fabric: bool = False  # the evidence points at the fabric (lifecycle.validation.is_fabric)


@dataclass(frozen=True, slots=True)
class RepairAttempt:
    time: datetime
    fault: str  # Fault.key
    step: RepairStep
    ok: bool


@dataclass(frozen=True, slots=True)
class NextStep:
    step: RepairStep
    reason: str
    lemon: bool = False  # a retire recommendation rather than a repair ticket


def ladder_for(fault: Fault, *, bmc: bool = False) -> tuple[RepairStep, ...]:
    """The rungs for ``fault``; with a BMC (``bmc``) the last reboot is a power cycle."""
    ladder: tuple[RepairStep, ...]
    if fault.key.startswith("sxid") and fault.action == Action.REBOOT:
        ladder = FABRIC_LADDER
    else:
        ladder = LADDERS.get(fault.action, ())
    if bmc and ladder and ladder[-1] == S.REBOOT:
        ladder = (*ladder[:-1], S.POWER_CYCLE)
    return ladder


def next_step(fault: Fault, history: Sequence[RepairAttempt], now: datetime, cfg: PolicyConfig, *,
              bmc: bool = False) -> NextStep:
    """The next rung for ``fault`` given every past attempt on the node (any order, any age);
    ``bmc``: the node has a BMC executor (the power-cycle rung)."""
    recent = [a for a in history if now - cfg.lemon_window <= a.time <= now and a.step != S.TICKET]
    if len(recent) >= cfg.lemon_repairs:
        return NextStep(S.TICKET, f"lemon node: {len(recent)} repairs within {format_duration(cfg.lemon_window)} "
                                  f"(limit {cfg.lemon_repairs}): retirement recommended", lemon=True)
    same = [a for a in history if a.fault == fault.key and now - cfg.reboot_window <= a.time <= now
            and a.step != S.TICKET]
    reboots = sum(1 for a in same if a.step in REBOOT_STEPS)
    window = format_duration(cfg.reboot_window)
    if reboots >= cfg.reboot_limit:
        return NextStep(S.TICKET, f"{fault.key} came back after {reboots} reboots within {window}: "
                                  "hardware inspection")
    ladder = ladder_for(fault, bmc=bmc)
    if not ladder:
        return NextStep(S.TICKET, f"{fault.key}: the catalog recommends {fault.action}; "
                                  "no automated repair can do that")
    if len(same) >= len(ladder):
        return NextStep(S.TICKET, f"{fault.key}: {len(same)} repair(s) within {window} did not hold "
                                  f"({', '.join(a.step for a in same)}): hardware inspection")
    step = ladder[len(same)]
    tried = f" after {', '.join(a.step for a in same)}" if same else ""
    return NextStep(step, f"{fault.key} ({fault.action}): {step}{tried}")
