"""What the decoder reports: one :class:`Finding` per hardware event found in a kernel log."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from gpufleet.domain.catalog import Action
from gpufleet.domain.events import Severity


class FindingKind(StrEnum):
    XID = "xid"  # NVRM Xid line (GPU driver error report)
    SXID = "sxid"  # NVSwitch SXid line
    AER = "aer"  # PCIe Advanced Error Reporting
    NVLINK = "nvlink"  # NVLink failure reported without an Xid
    IB_LINK = "ib_link"  # mlx5 / InfiniBand port or cable/module event
    MCE_EDAC = "mce_edac"  # host machine check or EDAC memory error
    OOM = "oom"  # kernel OOM kill
    GPU_LOST = "gpu_lost"  # GPU fell off the bus / failed to initialise
    CRASH_DUMP = "crash_dump"  # driver wrote a GPU crash dump
    KERNEL = "kernel"  # host kernel health: panic, hung task, soft/hard lockup, nvidia-peermem


@dataclass(frozen=True, slots=True)
class Finding:
    """One hardware event.

    ``pci`` is the normalised address (``dddd:bb:dd.f``, lower case) and ``pci_raw`` the text the
    log printed; both are None when the line names no device. ``time`` is the wall-clock time when
    the log gives one (or a boot time was supplied); ``uptime`` the seconds since boot when the log
    gives those (dmesg, /dev/kmsg). ``line`` is the 1-based line where the event starts; ``raw`` the
    joined text of every line that belongs to it. ``catalog_kind`` is the key the judgement was
    looked up under (``aer`` findings are judged as ``aer_corrected`` / ``aer_uncorrected``).
    ``detail`` carries parsed extras (link number, AER reporter, recovery action, ...).
    ``root_line`` is set on collateral findings by :func:`gpufleet.diagnose.grouping.fold`.
    ``severity``/``action`` are the catalog's judgement (:func:`gpufleet.domain.judgement.judge`) when
    the decoder had a catalog; ``stated`` is what the line itself said, which is all the agent reports.
    """

    kind: FindingKind
    code: int | None
    pci: str | None
    pci_raw: str | None
    time: datetime | None
    uptime: float | None
    severity: Severity
    action: Action
    name: str
    meaning: str
    component: str
    line: int
    raw: str
    catalog_kind: str
    detail: tuple[tuple[str, str], ...] = field(default=())
    collateral: bool = False
    root_line: int | None = None
    escalated: str = ""
    stated: Severity | None = None  # what the line itself says (a Fatal word, an uncorrected error)
    judged: bool = True  # False when decoded without a catalog (the agent): severity is then only ``stated``

    def get(self, key: str, default: str = "") -> str:
        """The ``detail`` value for ``key``."""
        for k, v in self.detail:
            if k == key:
                return v
        return default

    def to_dict(self) -> dict[str, object]:
        """The ``--json`` form of this finding (docs/diagnose.md, "JSON output")."""
        return {
            "kind": self.kind.value,
            "code": self.code,
            "pci": self.pci,
            "pci_raw": self.pci_raw,
            "time": self.time.isoformat() if self.time else None,
            "uptime": self.uptime,
            "severity": self.severity.value,
            "action": self.action.value,
            "name": self.name,
            "meaning": self.meaning,
            "component": self.component,
            "line": self.line,
            "raw": self.raw,
            "catalog_kind": self.catalog_kind,
            "detail": dict(self.detail),
            "collateral": self.collateral,
            "root_line": self.root_line,
            "escalated": self.escalated or None,
        }


_PCI = re.compile(
    r"^(?:PCI:)?(?:(?P<dom>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})"
    r"(?:\.(?P<fn>[0-7]))?$"
)


def normalise_pci(text: str) -> str | None:
    """``0000:3b:00`` / ``PCI:0000:3B:00`` / ``3b:00.0`` / ``00000000:3b:00.0`` -> ``0000:3b:00.0``.

    The domain defaults to 0000 and keeps at least four hex digits (``10003:00:00.0`` stays as is);
    the function defaults to 0. Returns None for text that is not a PCI address.
    """
    m = _PCI.match(text.strip())
    if m is None:
        return None
    dom = int(m["dom"], 16) if m["dom"] else 0
    return f"{dom:04x}:{int(m['bus'], 16):02x}:{int(m['dev'], 16):02x}.{m['fn'] or '0'}"
