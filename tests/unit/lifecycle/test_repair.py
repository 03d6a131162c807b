"""The repair escalation ladder (lifecycle.repair): rungs, reboot limit, lemon nodes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpufleet.domain.catalog import Action
from gpufleet.lifecycle.config import PolicyConfig
from gpufleet.lifecycle.repair import Fault, RepairAttempt, RepairStep, next_step

T0 = datetime(2026, 11, 21, 12, tzinfo=UTC)
CFG = PolicyConfig()
S = RepairStep
XID48 = Fault("xid:48", Action.RESET_GPU)
XID79 = Fault("xid:79", Action.REBOOT)


def at(days: float, fault: str, step: RepairStep, ok: bool = True) -> RepairAttempt:
    return RepairAttempt(T0 - timedelta(days=days), fault, step, ok)


def test_reset_gpu_fault_climbs_reset_reboot_reboot_then_ticket() -> None:
    seen: list[RepairAttempt] = []
    rungs = []
    for i in range(4):
        nxt = next_step(XID48, seen, T0 + timedelta(hours=i), CFG)
        rungs.append(nxt.step)
        seen.append(RepairAttempt(T0 + timedelta(hours=i), "xid:48", nxt.step, True))
    assert rungs == [S.GPU_RESET, S.REBOOT, S.REBOOT, S.TICKET]


def test_two_reboots_for_the_same_fault_within_seven_days_is_a_hardware_ticket() -> None:
    history = [at(6, "xid:79", S.REBOOT), at(1, "xid:79", S.REBOOT)]
    nxt = next_step(XID79, history, T0, CFG)
    assert nxt.step == S.TICKET and not nxt.lemon
    assert nxt.reason.startswith("xid:79 came back after 2 reboots within 7d")


def test_reboots_older_than_the_window_or_for_another_fault_do_not_count() -> None:
    history = [at(8, "xid:79", S.REBOOT), at(1, "xid:62", S.REBOOT)]
    assert next_step(XID79, history, T0, CFG).step == S.REBOOT
    assert next_step(XID79, [at(1, "xid:79", S.REBOOT)], T0, CFG).step == S.REBOOT  # the second reboot


def test_a_failed_step_counts_as_a_rung() -> None:
    assert next_step(XID48, [at(0.01, "xid:48", S.GPU_RESET, ok=False)], T0, CFG).step == S.REBOOT


def test_faults_software_cannot_fix_go_to_people_at_once() -> None:
    for action in (Action.REPLACE, Action.DRAIN_AND_INSPECT, Action.CHECK_CABLING, Action.CONTACT_SUPPORT):
        nxt = next_step(Fault("x", action), [], T0, CFG)
        assert nxt.step == S.TICKET and action.value in nxt.reason


def test_nvswitch_faults_restart_the_fabric_manager_first() -> None:
    assert next_step(Fault("sxid:12028", Action.REBOOT), [], T0, CFG).step == S.RESTART_FABRIC_MANAGER


def test_lemon_node_gets_a_retire_recommendation() -> None:
    history = [at(d, f"xid:{c}", S.GPU_RESET) for d, c in ((29, 48), (20, 94), (10, 62), (2, 119))]
    nxt = next_step(XID48, history, T0, CFG)
    assert nxt.step == S.TICKET and nxt.lemon and "retirement recommended" in nxt.reason
    assert not next_step(XID48, history[1:], T0, CFG).lemon  # three within 30d: not yet
    few = PolicyConfig(lemon_repairs=2, lemon_window=timedelta(days=5))
    assert next_step(XID48, history, T0, few).step == S.GPU_RESET  # only one attempt within 5 days


def climb(fault: Fault, *, bmc: bool, ok: bool = True) -> list[RepairStep]:
    seen: list[RepairAttempt] = []
    rungs = []
    for i in range(5):
        nxt = next_step(fault, seen, T0 + timedelta(hours=i), CFG, bmc=bmc)
        rungs.append(nxt.step)
        if nxt.step == S.TICKET:
            break
        seen.append(RepairAttempt(T0 + timedelta(hours=i), fault.key, nxt.step, ok))
    return rungs


def test_with_a_bmc_the_last_reboot_is_a_power_cycle() -> None:
    assert climb(XID48, bmc=True) == [S.GPU_RESET, S.REBOOT, S.POWER_CYCLE, S.TICKET]
    assert climb(XID79, bmc=True, ok=False) == [S.REBOOT, S.POWER_CYCLE, S.TICKET]
    assert climb(Fault("sxid:12028", Action.REBOOT), bmc=True) == [S.RESTART_FABRIC_MANAGER, S.REBOOT,
                                                                    S.POWER_CYCLE, S.TICKET]
    assert climb(Fault("check_failed", Action.REPLACE), bmc=True) == [S.TICKET]


def test_a_power_cycle_counts_towards_the_reboot_limit() -> None:
    history = [at(1, "xid:79", S.POWER_CYCLE), at(2, "xid:79", S.REBOOT)]
    nxt = next_step(XID79, history, T0, CFG, bmc=True)
    assert nxt.step == S.TICKET and "2 reboots" in nxt.reason
