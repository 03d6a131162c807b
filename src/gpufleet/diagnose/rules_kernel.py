"""Recognisers for the host kernel's own health lines: panics, hung tasks, lockups, RCU stalls,
oopses, GHES hardware-error reports and BERT records of the previous boot, NETDEV watchdog timeouts,
nvidia-peermem errors and OOM reports that end at the ``oom-kill:constraint=`` line.

Each wording is the kernel's (``kernel/panic.c``, ``kernel/hung_task.c``, ``kernel/watchdog.c``,
``kernel/rcu/tree_stall.h``, ``arch/x86/mm/fault.c``, ``arch/arm64/mm/fault.c``, ``lib/bug.c``,
``drivers/firmware/efi/cper.c``, ``drivers/acpi/apei/bert.c``, ``net/sched/sch_generic.c``,
``mm/oom_kill.c``) across generations; real examples with their sources are in
``tests/fixtures/kernel-logs/host-kernel.log`` and ``host-oops-rcu-bert.log``.
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
# "rcu: INFO: rcu_preempt self-detected stall on CPU", "INFO: rcu_sched detected stalls on CPUs/tasks: { 3}
# (detected by 0, ...)" (3.x-4.x), "rcu: INFO: rcu_sched detected expedited stalls on CPUs/tasks: ..."
_RCU = re.compile(r"INFO: (rcu_\w+|rcu) (self-detected stall on CPU|detected (?:expedited )?stalls on CPUs/tasks)")
_RCU_CPU = re.compile(r"^rcu:\s+(\d+)-[.\w!]+:|\{\s*([\d ,\-]+?)\s*\}")
# The first line of an oops, every generation and x86/arm64: "BUG: kernel NULL pointer dereference, address:
# 0000000000000008" (5.x on), "BUG: unable to handle kernel NULL pointer dereference at 0000000000000008" and
# "... paging request at ..." (older), "BUG: unable to handle page fault for address: ...", arm64 "Unable to
# handle kernel NULL pointer dereference at virtual address ...", "kernel BUG at fs/ext4/inode.c:1234!",
# "general protection fault, probably for non-canonical address 0x...: 0000 [#1] SMP" and the "Oops: ..." /
# "Internal error: Oops: ..." line itself when it comes first. A user process's "traps: x[1] general protection
# fault ip:..." is not one (no "[#n]" oops counter).
_OOPS = re.compile(
    r"(BUG: kernel NULL pointer dereference|BUG: unable to handle (?:kernel )?(?:NULL pointer dereference|paging "
    r"request|page fault)|Unable to handle kernel (?:NULL pointer dereference|paging request)|kernel BUG at \S+!"
    r"|(?:Oops: )?general protection fault(?:, probably for non-canonical address 0x[0-9a-f]+)?: [0-9a-f]{4} \[#\d+\]"
    r"|(?:Internal error: )?Oops: (?:Oops: )?(?:[\w ]+: )?[0-9a-f]{4,16} \[#\d+\])"
)
# Lines of the same oops report: the page-fault decode, the Oops line, CPU/task, registers, code, call trace.
_OOPS_CONT = re.compile(
    r"^(?:#PF: |PGD |P4D |Oops: |Internal error: |invalid opcode: |general protection fault|CPU: \d|Tainted: "
    r"|Hardware name: |Workqueue: |RIP: |IP: |pc : |lr : |sp : |task: |Code: |RSP: |RAX: |RDX: |RBP: |R\d+: |FS: |CS: "
    r"|CR2: |DR\d: "
    r"|PKRU: |Call [Tt]race:|</?TASK>|</?IRQ>|\?? ?[\w.]+\+0x[0-9a-f]+/0x[0-9a-f]+|Modules linked in:|Mem abort info:"
    r"|Data abort info:|ESR = |EC = |SET = |FAR = |EA = |S1PTW = |FSC = |ISV = |CM = |WnR = |GCS = |user pgtable"
    r"|\[[0-9a-f]{8,16}\] |x\d+ *: |pstate: |---\[ end trace)"
)
_OOPS_TASK = re.compile(r"CPU: (\d+) (?:UID: \d+ )?PID: (\d+) Comm: (\S+)")
_OOPS_PC = re.compile(
    r"^(?:RIP: [0-9a-f]{4}:(?:\[<[0-9a-f]+>\]\s+\[<[0-9a-f]+>\])?|pc : )\s*"
    r"([\w.]+)\+0x[0-9a-f]+/0x[0-9a-f]+(?: \[(\w+)\])?"
)
_CONSTRAINT = re.compile(r"oom-kill:constraint=(\w+),.*?,task=([^,]*),pid=(\d+),uid=(\d+)")
_MEMCG = re.compile(r"task_memcg=([^,]*)")


class Ghes(Pending):
    """``{1}[Hardware Error]: event severity: fatal`` and the ``[Hardware Error]:`` lines after it."""

    max_lines = 32

    def accept(self, msg: str) -> bool:
        return "[Hardware Error]:" in msg and "event severity:" not in msg and self.lines < self.max_lines


class RcuStall(Pending):
    """``rcu: INFO: rcu_sched self-detected stall on CPU`` and the ``rcu:`` / ``(t=... jiffies`` /
    ``(detected by ...)`` lines after it, which name the stalled CPUs."""

    max_lines = 24

    def accept(self, msg: str) -> bool:
        text = msg.lstrip()
        if self.lines >= self.max_lines or self.hit is None or "INFO:" in text:
            return False
        if not (text.startswith(("rcu:", "(t=", "(detected by", "Tasks blocked")) or "jiffies" in text):
            return False
        _rcu_cpus(self.hit, text)
        return True


def _rcu_cpus(hit: Hit, text: str) -> None:
    m = _RCU_CPU.search(text)
    if m:
        cpus = dict(hit.detail).get("cpus", "")
        found = (m[1] or m[2] or "").replace(" ", "")
        hit.detail = [d for d in hit.detail if d[0] != "cpus"] + [("cpus", f"{cpus},{found}".strip(","))]


class Oops(Pending):
    """An oops report: its first line (``BUG: ...``, ``Oops: ...``, ``kernel BUG at``, a general protection
    fault) and the lines of the same report after it, from which the task and the faulting function and
    module are read (``RIP: 0010:_nv012345rm+0x1d/0x50 [nvidia]``: the GPU driver)."""

    max_lines = 96

    def accept(self, msg: str) -> bool:
        text = msg.lstrip()
        if self.lines >= self.max_lines or self.hit is None or _OOPS_CONT.match(text) is None:
            return False
        if text.startswith(("BUG:", "Unable to handle", "kernel BUG")):
            return False  # the next oops
        d = dict(self.hit.detail)
        m = _OOPS_TASK.match(text)
        if m and "process" not in d:
            self.hit.detail += [("cpu", m[1]), ("pid", m[2]), ("process", m[3])]
        m = _OOPS_PC.match(text)
        if m and "function" not in d:
            self.hit.detail.append(("function", m[1]))
            if m[2]:
                self.hit.detail.append(("module", m[2]))
                self.hit.name = f"kernel oops in {m[2]}"
        return True


class Bert(Pending):
    """``BERT: Error records from previous boot:`` and the ``[Hardware Error]:`` records after it: what
    the firmware kept of the error that ended the previous boot. Not a live error, so not the GHES
    recogniser's: a fatal record states degraded (the node died of a hardware error; inspect it before
    trusting it), a recoverable or corrected one info."""

    max_lines = 256

    def accept(self, msg: str) -> bool:
        if self.lines >= self.max_lines or self.hit is None:
            return False
        if "[Hardware Error]:" not in msg and not msg.lstrip().startswith("BERT:"):
            return False
        m = _GHES.search(msg)
        if m:
            classes = [v for k, v in self.hit.detail if k == "class"]
            self.hit.detail.append(("class", m[1]))
            if m[1] == "fatal" or "fatal" in classes:
                self.hit.stated, self.hit.name = _DEGRADED, "previous boot ended in a fatal hardware error"
        elif "section_type:" in msg or "section type:" in msg:
            self.hit.detail.append(("section", msg.split("type:", 1)[1].strip()[:80]))
        return True


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
    if "stall" in msg:
        m = _RCU.search(msg)
        if m:
            hit = Hit(FindingKind.KERNEL, None, None, "kernel", stated=_DEGRADED, name="RCU stall",
                      meaning=f"{m[1]}: {m[2]}: a CPU stopped passing through quiescent states",
                      detail=[("event", "rcu_stall"), ("flavor", m[1])])
            _rcu_cpus(hit, msg[m.end():])
            return RcuStall(hit)
    m = _OOPS.search(msg) if ("BUG" in msg or "Oops" in msg or "Unable to handle" in msg
                             or "protection fault" in msg) else None
    if m:
        head = m[1]
        return Oops(Hit(FindingKind.KERNEL, None, None, "kernel_oops", stated=_DEGRADED, name="kernel oops",
                        meaning=msg[m.start():][:160], detail=[("event", "oops"), ("first", head[:80])]))
    if "Error records from previous boot" in msg:
        return Bert(Hit(FindingKind.MCE_EDAC, None, None, "mce_edac", name="hardware error record of the previous boot",
                        detail=[("event", "bert")]))
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
