"""Recognisers for host-side events: PCIe AER, mlx5/InfiniBand links, MCE/EDAC, OOM kills."""

from __future__ import annotations

import re

from gpufleet.diagnose.finding import FindingKind
from gpufleet.diagnose.rules import Hit, Pending
from gpufleet.domain.catalog import Action
from gpufleet.domain.events import Severity

_BDF = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_DEV = re.compile(rf"({_BDF})(?: [\w.\-]+)?: ")
_CLASS = (
    r"(Corrected|Correctable|Uncorrected \(Non-Fatal\)|Uncorrectable \(Non-Fatal\)|"
    r"Uncorrected \(Fatal\)|Uncorrectable \(Fatal\))"
)

# -- PCIe AER -----------------------------------------------------------------------------------------

_AER_RECEIVED = re.compile(
    rf"AER: (?:Multiple )?{_CLASS} error (?:message )?received(?: from|:)\s*"
    rf"(?:id=([0-9a-fA-F]{{4}})|({_BDF}))?"
)
_AER_BUS = re.compile(
    rf"PCIe Bus Error: severity={_CLASS}, type=([^,]+)(?:,\s*(?:id=([0-9a-fA-F]{{4}}))?\(?([^)]*)\)?)?"
)
_AER_STATUS = re.compile(r"error status/mask=([0-9a-fA-F]{8})/([0-9a-fA-F]{8})")
_AER_BIT = re.compile(r"(?:^|: )(?:AER: )?\s*\[\s*(\d{1,2})\]\s+(.*?)\s*(\(First\))?\s*$")


def _klass(text: str) -> str:
    if text.startswith("Correct"):
        return "corrected"
    return "fatal" if "(Fatal)" in text else "nonfatal"


def _decode_id(ident: str, reporter: str) -> str:
    """``id=00e8`` (bus << 8 | devfn) in the reporter's PCI domain."""
    v = int(ident, 16)
    dom = reporter.split(":", maxsplit=1)[0] if reporter.count(":") == 2 else "0000"
    return f"{dom}:{v >> 8:02x}:{(v & 0xFF) >> 3:02x}.{v & 7}"


class AerEvent(Pending):
    """``AER: ... error received`` + ``PCIe Bus Error: severity=..`` + status + ``[ n] Name`` lines."""

    max_lines = 40

    def __init__(self, klass: str, reporter: str | None, source: str | None) -> None:
        hit = Hit(FindingKind.AER, None, source, _catalog_kind(klass))
        super().__init__(hit)
        self.klass = klass
        self.reporter = reporter
        self.has_bus_error = False
        self.bits: list[tuple[int, str, bool]] = []
        self.status: int | None = None
        self.mask = 0
        self.etype = ""

    def bus_error(self, msg: str, m: re.Match[str]) -> None:
        self.has_bus_error = True
        self.klass = _klass(m[1])
        self.etype = m[2].strip()
        dev = _DEV.search(msg)
        assert self.hit is not None
        # The device that prints "PCIe Bus Error" is the one whose AER registers hold the error; the
        # requester id of the "error received" line is kept as ``source_id``.
        if self.hit.pci_raw is not None:
            self.hit.detail.append(("source_id", self.hit.pci_raw))
        if dev:
            self.hit.pci_raw = dev[1]
        elif m[3] and self.reporter:
            self.hit.pci_raw = _decode_id(m[3], self.reporter)
        if m[4]:
            self.hit.detail.append(("agent", m[4].strip()))

    def accept(self, msg: str) -> bool:
        if self.lines >= self.max_lines:
            return False
        m = _AER_BUS.search(msg)
        if m:
            if self.has_bus_error:
                return False
            self.bus_error(msg, m)
            return True
        s = _AER_STATUS.search(msg)
        if s:
            self.status, self.mask = int(s[1], 16), int(s[2], 16)
            return True
        b = _AER_BIT.search(msg)
        if b and (self.has_bus_error or self.status is not None):
            self.bits.append((int(b[1]), b[2].strip(), bool(b[3])))
            return True
        return "TLP Header" in msg or "Error of this Agent" in msg

    def finish(self) -> Hit | None:
        hit = self.hit
        assert hit is not None
        hit.catalog_kind = _catalog_kind(self.klass)
        first = next((b for b in self.bits if b[2]), self.bits[0] if self.bits else None)
        if first is not None:
            hit.code = first[0]
            hit.detail.append(("error", first[1]))
        elif self.status:
            unmasked = self.status & ~self.mask or self.status
            hit.code = (unmasked & -unmasked).bit_length() - 1
        if len(self.bits) > 1:
            hit.detail.append(("all_errors", ",".join(f"{b[0]}:{b[1]}" for b in self.bits)))
        hit.detail.append(("aer_severity", self.klass))
        if self.etype:
            hit.detail.append(("type", self.etype))
        if self.reporter:
            hit.detail.append(("reporter", self.reporter))
        if self.status is not None:
            hit.detail.append(("status", f"{self.status:08x}/{self.mask:08x}"))
        if self.klass == "fatal":
            hit.stated = (Severity.FATAL, Action.DRAIN_AND_INSPECT)
        hit.name = f"AER {self.klass}" + (f" {first[1]}" if first else "")
        return hit


def _catalog_kind(klass: str) -> str:
    return "aer_corrected" if klass == "corrected" else "aer_uncorrected"


def aer(msg: str) -> Pending | None:
    m = _AER_RECEIVED.search(msg)
    if m:
        dev = _DEV.search(msg)
        reporter = dev[1] if dev else None
        source = m[3] or (_decode_id(m[2], reporter or "") if m[2] else None)
        return AerEvent(_klass(m[1]), reporter, source)
    m = _AER_BUS.search(msg)
    if m:
        ev = AerEvent(_klass(m[1]), None, None)
        ev.bus_error(msg, m)
        return ev
    return None


# -- mlx5 / InfiniBand ------------------------------------------------------------------------------

_PORT_STATE = re.compile(rf"({_BDF})(?: (\S+))?: Port: (\d+) Link (DOWN|INIT|ARMED|ACTIVE\w*)")
_NETDEV_LINK = re.compile(rf"mlx5_core ({_BDF}) (\S+): Link (down|up)\b")
_MODULE = re.compile(
    rf"(?:({_BDF}): )?Port module event(?:\[error\])?: module (\d+), "
    r"Cable (plugged|unplugged|error)(?:, (.*))?"
)
_NIC_FATAL = re.compile(
    r"(device's health compromised|unrecoverable hardware error|Will cause a leak of a command resource)"
)


class LinkUp(Pending):
    """Not an event: a port came (back) up. The decoder uses it to recognise flapping links."""

    def __init__(self, key: str) -> None:
        super().__init__(None)
        self.key = key


def nic(msg: str) -> Pending | None:
    m = _PORT_STATE.search(msg)
    if m:
        key = f"{m[1]}/{m[3]}"
        if m[4] == "DOWN":
            return Pending(Hit(FindingKind.IB_LINK, None, m[1], "ib_link", name="IB port down",
                               detail=[("event", "link_down"), ("port", m[3]), ("device", m[2] or "")]))
        return LinkUp(key) if m[4].startswith("ACTIVE") else None
    m = _NETDEV_LINK.search(msg)
    if m:
        key = f"{m[1]}/{m[2]}"
        if m[3] == "down":
            return Pending(Hit(FindingKind.IB_LINK, None, m[1], "ib_link", name="NIC link down",
                               detail=[("event", "link_down"), ("port", m[2])]))
        return LinkUp(key)
    m = _MODULE.search(msg)
    if m:
        if m[3] == "plugged":
            return None
        reason = (m[4] or "").strip()
        name = "cable unplugged" if m[3] == "unplugged" else f"cable error: {reason or 'unknown'}"
        hit = Hit(FindingKind.IB_LINK, None, m[1], "ib_link", name=name,
                  detail=[("event", "cable"), ("module", m[2])] + ([("reason", reason)] if reason else []))
        if "Temperature" in reason:
            hit.stated = (Severity.DEGRADED, Action.DRAIN_AND_INSPECT)
        return Pending(hit)
    m = _NIC_FATAL.search(msg)
    if m and "mlx5" in msg:
        dev = _DEV.search(msg)
        return Pending(Hit(FindingKind.IB_LINK, None, dev[1] if dev else None, "ib_link",
                           stated=(Severity.FATAL, Action.DRAIN_AND_INSPECT), name="NIC device failure",
                           meaning=f"mlx5 reports: {m[1]}", detail=[("event", "device_error")]))
    return None


# -- MCE / EDAC -------------------------------------------------------------------------------------

_EDAC_COUNT = re.compile(r"EDAC (MC\d+): (\d+) (CE|UE) (.*)")
_EDAC_DETAIL = re.compile(r"EDAC \w+ MC\d+: (?:HANDLING MCE|CPU \d|TSC|ADDR|MISC|PROCESSOR)")
_MCE_BANK = re.compile(r"Machine Check(?: Event| Exception)?: \d+ Bank (\d+): ([0-9a-fA-F]{1,16})")
_UC_BIT, _PCC_BIT = 1 << 61, 1 << 57


class McePending(Pending):
    max_lines = 24

    def accept(self, msg: str) -> bool:
        if self.lines >= self.max_lines:
            return False
        if "Machine check events logged" in msg:
            return False  # a new batch starts a new event
        if "Hardware Error]" in msg or _EDAC_DETAIL.search(msg):
            _bank(self, msg)
            return True
        m = _EDAC_COUNT.search(msg)
        if m and self.hit is not None and ("class", "CE") not in self.hit.detail and (
            "class", "UE") not in self.hit.detail:
            _edac(self, m)  # the EDAC decode of this machine check; a second count is a new event
            return True
        return False


def _bank(p: Pending, msg: str) -> None:
    b = _MCE_BANK.search(msg)
    if b and p.hit is not None:
        status = int(b[2], 16)
        p.hit.detail += [("bank", b[1]), ("mci_status", b[2])]
        if status & (_UC_BIT | _PCC_BIT):
            p.hit.stated = (Severity.FATAL, Action.DRAIN_AND_INSPECT)
            p.hit.name = "uncorrected machine check"
    if "Processor context corrupt" in msg and p.hit is not None:
        p.hit.stated = (Severity.FATAL, Action.DRAIN_AND_INSPECT)


def _edac(p: Pending, m: re.Match[str]) -> None:
    assert p.hit is not None
    p.hit.detail += [("mc", m[1]), ("count", m[2]), ("class", m[3]), ("location", m[4][:160])]
    p.hit.name = f"EDAC {m[3]} memory error"
    if m[3] == "UE":
        p.hit.stated = (Severity.FATAL, Action.DRAIN_AND_INSPECT)


def mce(msg: str) -> Pending | None:
    if "Machine check events logged" in msg or "HANDLING MCE MEMORY ERROR" in msg or _MCE_BANK.search(msg):
        p = McePending(Hit(FindingKind.MCE_EDAC, None, None, "mce_edac", name="machine check"))
        _bank(p, msg)
        return p
    m = _EDAC_COUNT.search(msg)
    if m:
        p = McePending(Hit(FindingKind.MCE_EDAC, None, None, "mce_edac"))
        _edac(p, m)
        return p
    if "Uncorrected hardware memory error" in msg:
        fatal = (Severity.FATAL, Action.DRAIN_AND_INSPECT)
        return Pending(Hit(FindingKind.MCE_EDAC, None, None, "mce_edac", stated=fatal, name="uncorrected memory error"))
    m2 = re.search(r"Memory failure: (0x[0-9a-fA-F]+): .*?: (Recovered|Failed|Ignored|Delayed)", msg)
    if m2:
        sev = Severity.DEGRADED if m2[2] == "Recovered" else Severity.FATAL
        stated = (sev, Action.DRAIN_AND_INSPECT)
        return Pending(Hit(FindingKind.MCE_EDAC, None, None, "mce_edac", stated=stated,
                           name=f"memory failure ({m2[2].lower()})", detail=[("pfn", m2[1])]))
    return None


# -- OOM --------------------------------------------------------------------------------------------


class OomStart(Pending):
    """Not an event: ``... invoked oom-killer`` starts the report that ``Killed process`` ends."""


# Every generation's wording: "Out of memory: Killed process N (comm) total-vm:..." (4.x on),
# "Memory cgroup out of memory: Killed process N (comm)", "Killed process N (comm) total-vm:..." after
# "Out of memory: Kill process N (comm) score S or sacrifice child" (3.x-4.x), and 2.6's
# "Killed process N, UID n, (comm)" / "Out of memory (oom_kill_allocating_task): Killed process ...".
KILLED = re.compile(
    r"(?:(Memory cgroup out of memory|Out of memory)(?: \(oom_kill_allocating_task\))?: )?"
    r"Killed process (\d+),? (?:UID (\d+), )?\((.*?)\)"
)


def oom_hit(m: re.Match[str]) -> Hit:
    scope = "cgroup" if m[1] and m[1].startswith("Memory cgroup") else "global"
    detail = [("pid", m[2]), ("process", m[4]), ("scope", scope)] + ([("uid", m[3])] if m[3] else [])
    return Hit(FindingKind.OOM, None, None, "oom", name=f"OOM kill of {m[4]}", detail=detail)


def oom(msg: str) -> Pending | None:
    m = KILLED.search(msg)
    return Pending(oom_hit(m)) if m else None
