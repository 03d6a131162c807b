"""Recognisers: which kernel messages are hardware events, and what they say.

Each recogniser looks at one message (the line without its timestamp/host prefix) and returns a
:class:`Hit`, or a :class:`Pending` event that later lines complete (AER detail lines, the
three-line "fallen off the bus" notice, SXid detail lines, register dumps). Every regular expression
here runs only on lines that hold one of :data:`CANDIDATE_WORDS` (the cheap test, candidates.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpufleet.diagnose.finding import FindingKind
from gpufleet.domain import nvlink5
from gpufleet.domain.catalog import Action
from gpufleet.domain.events import Severity

# A line can only be (the start of) an event if it contains one of these: the test every line of a
# multi-GB log pays. All words are found in one Aho-Corasick pass (diagnose/candidates.py), so a new
# word costs little (bench/bench_diagnose.py); keep each one specific enough that benign lines rarely
# contain it, because every line that does is decoded (and rejected) by the recognisers.
CANDIDATE_WORDS = (
    "NVRM:", "SXid (PCI:", "AER:", "PCIe Bus Error", "mlx5_core", "EDAC", "Hardware Error",
    "hardware memory error", "Memory failure", "Killed process", "oom-kill", "nvidia: probe of",
    "detected NVSwitch", "Port module event", "Unable to determine the device handle",
    "Kernel panic - not syncing", "blocked for more than", "soft lockup - CPU#", "hard LOCKUP",
    "NETDEV WATCHDOG", "nvidia-peermem",
    "self-detected stall on CPU", "detected stalls on CPUs", "detected expedited stalls", "BUG: kernel NULL pointer",
    "BUG: unable to handle", "Unable to handle kernel", "kernel BUG at", "Oops: ", "general protection fault",
    "Error records from previous boot",
)



@dataclass(slots=True)
class Hit:
    """A recognised event before the catalog judges it. ``stated`` is a judgement the line itself
    makes (``Fatal``, ``UE``, ``Node Reboot Required``); the decoder takes the worse of it and the
    catalog's."""

    kind: FindingKind
    code: int | None
    pci_raw: str | None
    catalog_kind: str
    stated: tuple[Severity, Action] | None = None
    name: str = ""
    meaning: str = ""
    detail: list[tuple[str, str]] = field(default_factory=list)


class Pending:
    """An event whose later lines are still to come. ``accept`` says whether a message continues it;
    ``finish`` returns the event (or None when the lines turned out not to be an event)."""

    max_lines = 64

    def __init__(self, hit: Hit | None) -> None:
        self.hit = hit
        self.lines = 1

    def accept(self, msg: str) -> bool:
        """The base event takes no further lines; subclasses that do override this."""
        return False

    def finish(self) -> Hit | None:
        return self.hit


# -- NVRM Xid ---------------------------------------------------------------------------------------

_BDF = r"[0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"  # domain:bus:device (function optional below)
# Every address form the driver has printed inside ``Xid (...)``: ``PCI:0000:3b:00``, with a ``.0``
# function, the old ``0000:3b:00``, MIG ``PCI:0000:01:00 GPU-I:05 GPU-CI:02``, and redacted or empty
# text (then the Xid is reported against the node, its GPU unknown).
_XID = re.compile(r"NVRM: Xid\s*(?:\(([^()]{0,96})\)\s*)?:\s*(\d{1,5})\b,?\s*(.*)")
_XID_ADDR = re.compile(
    rf"^\s*(?:PCI:)?({_BDF}(?:\.[0-7])?)?(?:\s+GPU-I:\s*(\d+))?(?:\s+GPU-CI:\s*(\d+))?\s*$"
)
_NVL5 = re.compile(
    r"^([A-Za-z0-9_/]+)\s+(Nonfatal|Non-fatal|Fatal|Link [Ff]atal)\s+(?:(\S+)\s+(\S+)\s+)?Link\s+(-?\d+)"
    r"(?:\s*\(([^)]*)\)?)?"
)
_HEX = re.compile(r"0x([0-9a-fA-F]{1,8})\b")
_RECOVERY = re.compile(
    r"recovery action changed from (0x[0-9a-fA-F]+) \(([^)]*)\) to (0x[0-9a-fA-F]+) \(([^)]*)\)"
)
_CAUSED_BY = re.compile(r"caused by previous Xid (\d+)")
_LINK = re.compile(r"\blink (\d+)\b", re.IGNORECASE)
_PIDNAME = re.compile(r"pid=('?[^,']*'?),\s*name=([^,]*),\s*")
_RECOVERY_JUDGEMENT: dict[str, tuple[Severity, Action]] = {
    "none": (Severity.INFO, Action.NONE),
    "gpu reset required": (Severity.FATAL, Action.RESET_GPU),
    "pf flr": (Severity.FATAL, Action.RESET_GPU),
    "node reboot required": (Severity.FATAL, Action.REBOOT),
    "os reboot": (Severity.FATAL, Action.REBOOT),
    "drain p2p": (Severity.DEGRADED, Action.DRAIN_AND_INSPECT),
    "drain and reset": (Severity.FATAL, Action.RESET_GPU),
}


class _XidDump(Pending):
    """Indented ``NVRM:     ...`` register-dump lines that follow an Xid (GSP exceptions)."""

    def accept(self, msg: str) -> bool:
        return msg.startswith("NVRM:    ") and self.lines < self.max_lines


def xid(msg: str) -> Pending | None:
    m = _XID.search(msg)
    if m is None:
        return None
    code = int(m[2])
    rest = m[3]
    inside = (m[1] or "").strip()
    addr = _XID_ADDR.match(inside)
    hit = Hit(FindingKind.XID, code, addr[1] if addr and addr[1] else None, "xid")
    if addr is None or addr[1] is None:
        hit.detail.append(("address", inside[:64] or "none"))  # redacted or missing: GPU unknown
    elif addr[2] is not None:
        hit.detail.append(("gpu_instance", addr[2]))
        if addr[3] is not None:
            hit.detail.append(("compute_instance", addr[3]))
    pn = _PIDNAME.match(rest)
    if pn:
        hit.detail += [("pid", pn[1].strip("'")), ("process", pn[2].strip())]
        rest = rest[pn.end() :]
    elif rest.startswith("pid="):
        pid, _, rest = rest.partition(",")
        hit.detail.append(("pid", pid[4:].strip("'")))
        rest = rest.strip()
    if 144 <= code <= 150:
        _nvlink5(hit, code, rest)
    rec = _RECOVERY.search(rest)
    if rec:
        hit.detail += [("recovery_from", rec[2]), ("recovery_to", rec[4])]
        hit.stated = _RECOVERY_JUDGEMENT.get(rec[4].strip().lower(), (Severity.DEGRADED, Action.CONTACT_SUPPORT))
    cb = _CAUSED_BY.search(rest)
    if cb:
        hit.detail.append(("caused_by_xid", cb[1]))
    if code == 74:
        lk = _LINK.search(rest)
        if lk:
            hit.detail.append(("link", lk[1]))
    hit.detail.append(("message", rest.strip()[:200]))
    return _XidDump(hit)


def _nvlink5(hit: Hit, code: int, rest: str) -> None:
    """Xid 144-150: the line's unit, link and registers, decoded by NVIDIA's subcode table. The row
    (``nvl5_row``) is what the catalog judges the line by (decision 0031), and its severity is what
    the line states (it settles a ``Fatal`` word the table calls non-fatal). Without a table row the
    line's own word counts, and a line with no word at all is degraded: look at it."""
    nvl = _NVL5.match(rest)
    if nvl is None:
        hit.stated = (Severity.DEGRADED, Action.RESET_GPU)
        return
    unit, sev_word = nvl[1], nvl[2]
    regs = [int(x, 16) for x in _HEX.findall(nvl[6] or "")]
    hit.detail += [("unit", unit), ("link", str(int(nvl[5])) if nvl[5].lstrip("-").isdigit() else nvl[5]),
                   ("registers", (nvl[6] or "").strip()), ("nvlink_severity", sev_word)]
    if regs:
        hit.detail += [("intrinfo", f"0x{regs[0]:08x}"), ("subcode", str(nvlink5.subcode(regs[0])))]
    if len(regs) > 1:
        hit.detail.append(("error_status", f"0x{regs[1]:08x}"))
    rule = nvlink5.decode(code, unit, regs)
    if rule is not None:
        hit.stated = (rule.stated, Action.RESET_GPU if rule.stated is Severity.FATAL else Action.NONE)
        hit.detail += [("nvl5_rule", f"{rule.unit} {rule.severity} {rule.resolution}"), ("nvl5_row", rule.key),
                       ("hw_sw", rule.hw_sw), ("effect", rule.effect)]
        if rule.suspect:
            hit.detail.append(("suspect", rule.suspect))
        hit.meaning = f"{rule.unit}: {rule.severity}, NVIDIA resolution {rule.resolution}, " \
                      f"investigate {rule.investigatory}"
    elif sev_word.lower() in ("fatal", "link fatal"):
        hit.stated = (Severity.FATAL, Action.RESET_GPU)
    else:
        hit.stated = (Severity.DEGRADED, Action.RESET_GPU)  # a subcode NVIDIA's table does not list


# -- GPU lost / init failures / crash dump ----------------------------------------------------------

_THE_GPU = re.compile(rf"NVRM: The NVIDIA GPU ({_BDF}\.\d)")
_FALLEN_ONE = re.compile(
    r"NVRM: GPU (?:at )?(?:PCI:)?((?:[0-9a-fA-F]{1,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?):? "
    r"(?:GPU )?has fallen off the bus"
)
# nvidia-smi's wording (bug reports, health-check output): "GPU is lost. Reboot the system ...".
_SMI_LOST = re.compile(
    r"Unable to determine the device handle for (?:GPU)?\s*([0-9a-fA-F]{4,8}:[0-9a-fA-F:.]+): GPU is lost"
)
_RMINIT = re.compile(rf"NVRM: (?:GPU ({_BDF}\.\d): )?RmInitAdapter failed!\s*(\S*)")
_PROBE = re.compile(r"nvidia: probe of ([0-9a-fA-F:.]+) failed with error (-?\d+)")
_PROBE_ROUTINE = re.compile(
    r"NVRM: (The NVIDIA probe routine failed for \d+ device|None of the NVIDIA devices were initialized)"
)


class _FallenOff(Pending):
    """``The NVIDIA GPU <pci>`` / ``(PCI ID: ..) installed in this system has`` / ``fallen off the
    bus and is not responding to commands.``: an event only once the last line arrives."""

    def __init__(self, pci: str) -> None:
        super().__init__(None)
        self.pci = pci
        self.pci_id = ""

    def accept(self, msg: str) -> bool:
        if self.hit is not None or self.lines >= 4 or "NVRM:" not in msg or "Xid" in msg:
            return False
        m = re.search(r"PCI ID: ([0-9a-fA-F]{4}:[0-9a-fA-F]{4})", msg)
        if m:
            self.pci_id = m[1]
        if "fallen off the bus" in msg:
            self.hit = Hit(FindingKind.GPU_LOST, None, self.pci, "gpu_lost",
                           name="GPU fallen off the bus",
                           meaning="the GPU stopped answering on PCIe; the driver lost it",
                           detail=[("pci_id", self.pci_id)] if self.pci_id else [])
            return True
        return "installed in this system" in msg or "(PCI ID:" in msg


class _RmInit(Pending):
    def accept(self, msg: str) -> bool:
        return "rm_init_adapter failed" in msg and self.lines < 3


class _CrashDump(Pending):
    def accept(self, msg: str) -> bool:
        return self.lines < 3 and ("nvidia-bug-report.sh as root" in msg or "module is unloaded" in msg)


def gpu_lost(msg: str) -> Pending | None:
    m = _THE_GPU.search(msg)
    if m:
        pend = _FallenOff(m[1])
        pend.accept(msg)  # single-line variants carry everything in the first line
        return pend
    m = _FALLEN_ONE.search(msg)
    if m:
        return Pending(Hit(FindingKind.GPU_LOST, None, m[1], "gpu_lost", name="GPU fallen off the bus",
                         meaning="the GPU stopped answering on PCIe; the driver lost it"))
    m = _SMI_LOST.search(msg)
    if m:
        return Pending(Hit(FindingKind.GPU_LOST, None, m[1], "gpu_lost", name="GPU is lost",
                           meaning="nvidia-smi cannot reach the GPU: it is lost until the node reboots"))
    m = _RMINIT.search(msg)
    if m:
        return _RmInit(Hit(FindingKind.GPU_LOST, None, m[1], "gpu_lost", name="GPU initialisation failed",
                           meaning="the driver could not initialise the GPU (RmInitAdapter failed)",
                           detail=[("rm_code", m[2])] if m[2] else []))
    m = _PROBE.search(msg)
    if m:
        return Pending(Hit(FindingKind.GPU_LOST, None, m[1], "gpu_lost", name="GPU probe failed",
                         meaning="the nvidia driver failed to probe the device", detail=[("error", m[2])]))
    m = _PROBE_ROUTINE.search(msg)
    if m:
        return Pending(Hit(FindingKind.GPU_LOST, None, None, "gpu_lost", name="GPU probe failed",
                         meaning=m[1]))
    if "NVRM: A GPU crash dump has been created" in msg:
        return _CrashDump(Hit(FindingKind.CRASH_DUMP, None, None, "crash_dump"))
    return None


# -- NVSwitch SXid ----------------------------------------------------------------------------------

_SXID = re.compile(r"nvidia-nvswitch(\d+): SXid \(PCI:([0-9a-fA-F:.]+)\): (\d{1,6}),\s*(.*)")
_SXID_HEAD = re.compile(r"^(Non-fatal|Nonfatal|Fatal),\s*(?:Link (\d+)\s*)?(.*)")
# fabricmanager.log: "[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch fatal error 20034 on fid
# 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 33"
_FM_SXID = re.compile(
    r"detected NVSwitch (fatal|non-fatal) error (\d{1,6}) on fid (\d+) on NVSwitch pci bus id "
    r"([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])(?: physical id (\d+))?(?: port (\d+))?"
)


class SxidEvent(Pending):
    """One switch's SXid: its header line and the ``Severity ...`` / ``Data {...}`` lines that follow.
    The decoder keeps one open per (switch, code), so the detail lines of several switches interleaved
    in the log each join their own header (``key``)."""

    def __init__(self, hit: Hit, key: tuple[str, int]) -> None:
        super().__init__(hit)
        self.key = key

    def accept(self, msg: str) -> bool:
        m = _SXID.search(msg)
        if m is None or self.hit is None or (m[2], int(m[3])) != self.key or self.lines >= 8:
            return False
        rest = m[4]
        if rest.startswith("Severity"):
            self.hit.detail.append(("severity_detail", rest[:120]))
            return True
        return rest.startswith("Data")


def sxid_key(msg: str) -> tuple[tuple[str, int], bool] | None:
    """(switch address, code) of a kernel SXid line, and whether it is a detail line."""
    m = _SXID.search(msg)
    if m is None:
        return None
    return (m[2], int(m[3])), m[4].startswith(("Severity", "Data"))


def sxid(msg: str) -> Pending | None:
    m = _SXID.search(msg)
    if m is None:
        return _fabric_manager(msg)
    hit = Hit(FindingKind.SXID, int(m[3]), m[2], "sxid", detail=[("nvswitch", m[1])])
    head = _SXID_HEAD.match(m[4])
    if head:
        if head[1] == "Fatal":
            hit.stated = (Severity.FATAL, Action.REBOOT)
        hit.detail.append(("sxid_severity", head[1]))
        if head[2]:
            hit.detail.append(("link", str(int(head[2]))))
        hit.detail.append(("message", head[3].strip()[:200]))
    else:
        hit.detail.append(("message", m[4].strip()[:200]))
    return SxidEvent(hit, (m[2], int(m[3])))


def _fabric_manager(msg: str) -> Pending | None:
    m = _FM_SXID.search(msg)
    if m is None:
        return None
    hit = Hit(FindingKind.SXID, int(m[2]), m[4], "sxid",
              detail=[("source", "fabricmanager"), ("sxid_severity", "Fatal" if m[1] == "fatal" else "Non-fatal"),
                      ("fid", m[3])])
    if m[5]:
        hit.detail.append(("nvswitch_physical_id", m[5]))
    if m[6]:
        hit.detail.append(("link", str(int(m[6]))))
    if m[1] == "fatal":
        hit.stated = (Severity.FATAL, Action.REBOOT)
    return Pending(hit)


# -- NVLink without an Xid --------------------------------------------------------------------------

_NVLINK_FAIL = re.compile(r"(?i)(?:nvlink|knvlink)\S*.*\b(fail\w*|error|timeout|fatal|down)\b")
_NVLINK_BENIGN = re.compile(r"(?i)nvlink.*\b(is up|initialized|up and active|registered)\b")


def nvlink(msg: str) -> Pending | None:
    if "NVRM" not in msg or _NVLINK_BENIGN.search(msg):
        return None
    m = _NVLINK_FAIL.search(msg)
    if m is None:
        return None
    pci = re.search(r"PCI:([0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})", msg)
    gpu = re.search(r"NVRM: GPU(\d+) ", msg)
    hit = Hit(FindingKind.NVLINK, None, pci[1] if pci else None, "nvlink",
              detail=[("message", msg[msg.find("NVRM") :][:200])])
    if gpu:
        hit.detail.append(("gpu_instance", gpu[1]))
    lk = _LINK.search(msg)
    if lk:
        hit.detail.append(("link", lk[1]))
    return Pending(hit)
