"""Recognisers for the host kernel's own health lines: panics, hung tasks, lockups, GHES
hardware-error reports, NETDEV watchdog timeouts, nvidia-peermem errors and OOM reports that end at
the ``oom-kill:constraint=`` line.

Each wording is the kernel's (``kernel/panic.c``, ``kernel/hung_task.c``, ``kernel/watchdog.c``,
``drivers/firmware/efi/cper.c``, ``net/sched/sch_generic.c``,
``mm/oom_kill.c``) across generations; real examples with their sources are in
``tests/fixtures/kernel-logs/host-kernel.log``.
"""

from __future__ import annotations

import re

from gpufleet.diagnose.finding import FindingKind
from gpufleet.diagnose.rules import Hit, Pending
from gpufleet.diagnose.rules_host import KILLED, oom_hit
from gpufleet.domain.catalog import Action
from gpufleet.domain.events import Severity

_FATAL_REBOOT = (Severity.FATAL, Action.REBOOT)
_DEGRADED = (Severity.DEGRADED, Action.DRAIN_AND_INSPECT)

_PANIC = re.compile(r"Kernel panic - not syncing:\s*(.*)")
_PANIC_MCE = re.compile(r"(?i)machine check|hardware error|\bMCE\b|Fatal local machine check")
_HUNG = re.compile(r"INFO: task (.+?):(\d+) blocked for more than (\d+) seconds")
_SOFT = re.compile(r"soft lockup - CPU#(\d+) stuck for (\d+)s!(?: \[(.*?):(\d+)\])?")
_HARD = re.compile(r"(?i)Watchdog detected hard LOCKUP on cpu (\d+)")
_GHES = re.compile(r"\[Hardware Error\]: event severity: (fatal|recoverable|corrected|info)")
# "NETDEV WATCHDOG: eth2 (igb): transmit queue 4 timed out", 2.x-4.x "NETDEV WATCHDOG: eth0: transmit timed
# out", 6.x "NETDEV WATCHDOG: CPU: 5: transmit queue 3 timed out 5120 ms"
_NETDEV = re.compile(
    r"NETDEV WATCHDOG: (?:CPU: \d+: )?(?:([^\s:()]+)(?: \(([^)]*)\))?: )?transmit (?:queue (\d+) )?timed out"
)
_PEERMEM = re.compile(r"nvidia[-_]peermem[:\s]+(\S*).*?\b(ERROR|error|failed|invalid context)\b")
_CONSTRAINT = re.compile(r"oom-kill:constraint=(\w+),.*?,task=([^,]*),pid=(\d+),uid=(\d+)")
_MEMCG = re.compile(r"task_memcg=([^,]*)")


class Ghes(Pending):
    """``{1}[Hardware Error]: event severity: fatal`` and the ``[Hardware Error]:`` lines after it."""

    max_lines = 32

    def accept(self, msg: str) -> bool:
        return "[Hardware Error]:" in msg and "event severity:" not in msg and self.lines < self.max_lines


class OomConstraint(Pending):
    """``oom-kill:constraint=...,task=perl,pid=N,uid=U``: the OOM report's summary. The ``Killed
    process`` line usually follows and joins it; a report that ends here is still an OOM kill."""

    def accept(self, msg: str) -> bool:
        m = KILLED.search(msg)
        if m is None or self.hit is None or self.lines > 1:
            return False
        killed = oom_hit(m)
        killed.detail += [d for d in self.hit.detail if d[0] in ("constraint", "memcg", "uid")]
        self.hit = killed
        return True


def kernel(msg: str) -> Pending | None:
    """A host-kernel health line, or None."""
    if "Kernel panic" in msg:
        m = _PANIC.search(msg)
        if m:
            reason = m[1].strip()[:160]
            if _PANIC_MCE.search(reason):
                return Pending(Hit(FindingKind.MCE_EDAC, None, None, "mce_edac", stated=_FATAL_REBOOT,
                                   name="kernel panic: fatal machine check", meaning=reason,
                                   detail=[("event", "panic"), ("reason", reason)]))
            return Pending(Hit(FindingKind.KERNEL, None, None, "kernel_panic", stated=_FATAL_REBOOT,
                               name="kernel panic", meaning=reason, detail=[("event", "panic"), ("reason", reason)]))
    if "blocked for more than" in msg:
        m = _HUNG.search(msg)
        if m:
            return Pending(Hit(FindingKind.KERNEL, None, None, "kernel", stated=_DEGRADED, name=f"hung task {m[1]}",
                               meaning=f"task blocked in the kernel for more than {m[3]} s",
                               detail=[("event", "hung_task"), ("process", m[1]), ("pid", m[2]), ("seconds", m[3])]))
    if "lockup" in msg or "LOCKUP" in msg:
        m = _SOFT.search(msg)
        if m:
            detail = [("event", "soft_lockup"), ("cpu", m[1]), ("seconds", m[2])]
            if m[3]:
                detail += [("process", m[3]), ("pid", m[4])]
            return Pending(Hit(FindingKind.KERNEL, None, None, "kernel", stated=_DEGRADED, name="soft lockup",
                               meaning=f"CPU {m[1]} stuck in the kernel for {m[2]} s", detail=detail))
        m = _HARD.search(msg)
        if m:
            return Pending(Hit(FindingKind.KERNEL, None, None, "kernel_panic", stated=_FATAL_REBOOT, name="hard lockup",
                               meaning=f"CPU {m[1]} stuck with interrupts off", detail=[("event", "hard_lockup"),
                                                                                        ("cpu", m[1])]))
    if "Processor context corrupt" in msg:
        return Pending(Hit(FindingKind.MCE_EDAC, None, None, "mce_edac", stated=_FATAL_REBOOT,
                           name="uncorrected machine check", meaning="processor context corrupt",
                           detail=[("event", "mce")]))
    if "event severity:" in msg:
        m = _GHES.search(msg)
        if m:
            sev = {"fatal": _FATAL_REBOOT, "recoverable": _DEGRADED}.get(m[1])
            return Ghes(Hit(FindingKind.MCE_EDAC, None, None, "mce_edac", stated=sev,
                            name=f"hardware error ({m[1]})", detail=[("event", "ghes"), ("class", m[1])]))
    if "NETDEV WATCHDOG" in msg:
        m = _NETDEV.search(msg)
        if m:
            return Pending(Hit(FindingKind.IB_LINK, None, None, "ib_link", stated=_DEGRADED,
                               name="NIC transmit timeout", meaning="NETDEV WATCHDOG: a transmit queue timed out",
                               detail=[("event", "tx_timeout"), ("device", m[1] or ""), ("driver", m[2] or ""),
                                       ("queue", m[3] or "")]))
    if "peermem" in msg:
        m = _PEERMEM.search(msg)
        if m and "inheriting taint" not in msg:
            return Pending(Hit(FindingKind.KERNEL, None, None, "peermem",
                               name="nvidia-peermem error", meaning=msg[msg.find("peermem") - 7:][:200],
                               detail=[("event", "peermem"), ("function", m[1])]))
    if "oom-kill:" in msg:
        m = _CONSTRAINT.search(msg)
        if m:
            memcg = _MEMCG.search(msg)
            hit = Hit(FindingKind.OOM, None, None, "oom", name=f"OOM kill of {m[2]}",
                      detail=[("pid", m[3]), ("process", m[2]),
                              ("scope", "cgroup" if m[1] == "CONSTRAINT_MEMCG" else "global"),
                              ("constraint", m[1]), ("uid", m[4])] + ([("memcg", memcg[1])] if memcg else []))
            return OomConstraint(hit)
    return None
