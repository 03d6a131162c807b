"""InfiniBand port state and error counters from ``/sys/class/infiniband`` (root injectable).

Layout (Linux ``Documentation/infiniband/sysfs.rst``; the mlx5 driver fills it the same way)::

    <root>/<hca>/ports/<n>/state          "4: ACTIVE"
    <root>/<hca>/ports/<n>/phys_state     "5: LinkUp"
    <root>/<hca>/ports/<n>/rate           "400 Gb/sec (4X NDR)"
    <root>/<hca>/ports/<n>/link_layer     "InfiniBand" | "Ethernet" (RoCE)
    <root>/<hca>/ports/<n>/counters/{symbol_error,link_downed,link_error_recovery,port_rcv_errors,
        excessive_buffer_overrun_errors,local_link_integrity_errors,port_xmit_discards,...}

The PMA counters saturate instead of wrapping (symbol_error is 16 bits, link_downed 8 bits in the IBTA
PortCounters attribute), so a counter stuck at its maximum is reported as is; rates use differences.
A file that cannot be read gives ``None`` for that value, never an exception.

:meth:`InfinibandCollector.identities` reads, for the inventory, what names each HCA it reads: the port
GUID (the low 64 bits of ``ports/<n>/gids/0``, else ``node_guid``), the PCI address (the target of the
``device`` link) and the network interface (``device/net/<name>``).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from gpufleet.domain.inventory import IbPort, NicUnit
from gpufleet.domain.topology import natural_key

log = logging.getLogger(__name__)

COUNTERS = (
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "excessive_buffer_overrun_errors",
    "local_link_integrity_errors",
    "port_xmit_discards",
)
_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")
_PCI = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


@dataclass(frozen=True, slots=True)
class IbPortReading:
    device: str  # "mlx5_0"
    port: int
    state: str  # "ACTIVE", "DOWN", "INIT", "ARMED", "" when unreadable
    state_id: int | None
    phys_state: str  # "LinkUp", "Disabled", "Polling"...
    rate_gbps: float | None
    link_layer: str
    counters: tuple[int | None, ...]  # in COUNTERS order

    def counter(self, name: str) -> int | None:
        return self.counters[COUNTERS.index(name)]

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def parse_state(text: str | None) -> tuple[int | None, str]:
    """``"4: ACTIVE"`` -> ``(4, "ACTIVE")``."""
    if not text:
        return None, ""
    num, sep, name = text.partition(":")
    if not sep:
        return None, text.strip()
    return _int(num.strip()), name.strip()


def parse_rate(text: str | None) -> float | None:
    """``"400 Gb/sec (4X NDR)"`` -> ``400.0``."""
    m = _RATE.match(text or "")
    return float(m.group(1)) if m else None


class InfinibandCollector:
    """Reads every port of every HCA under ``root``. Ports are found by :meth:`scan` (cached)."""

    def __init__(self, root: Path = Path("/sys/class/infiniband"), *, include_ethernet: bool = False) -> None:
        self.root = root
        self.include_ethernet = include_ethernet
        self._ports: list[tuple[str, int, Path]] | None = None

    def scan(self) -> list[tuple[str, int, Path]]:
        ports: list[tuple[str, int, Path]] = []
        if self.root.is_dir():
            # natural name order, as the controller maps them (identity.py): mlx5_2 before mlx5_10 (a DGX
            # H100 has mlx5_0 .. mlx5_11; in plain string order mlx5_10 was the third HCA, <node>-nic2)
            for hca in sorted(self.root.iterdir(), key=lambda d: natural_key(d.name)):
                pdir = hca / "ports"
                if not pdir.is_dir():
                    continue
                for p in sorted(pdir.iterdir(), key=lambda x: _int(x.name) or 0):
                    n = _int(p.name)
                    if n is None:
                        continue
                    layer = _read(p / "link_layer") or ""
                    if layer == "Ethernet" and not self.include_ethernet:
                        continue
                    ports.append((hca.name, n, p))
        self._ports = ports
        return ports

    def read(self) -> list[IbPortReading]:
        ports = self._ports if self._ports is not None else self.scan()
        out: list[IbPortReading] = []
        for dev, n, p in ports:
            sid, state = parse_state(_read(p / "state"))
            _, phys = parse_state(_read(p / "phys_state"))
            out.append(
                IbPortReading(
                    device=dev,
                    port=n,
                    state=state,
                    state_id=sid,
                    phys_state=phys,
                    rate_gbps=parse_rate(_read(p / "rate")),
                    link_layer=_read(p / "link_layer") or "InfiniBand",
                    counters=tuple(_int(_read(p / "counters" / c)) for c in COUNTERS),
                )
            )
        return out

    def identities(self) -> tuple[NicUnit, ...]:
        """Each HCA this collector reads (same ports, same order: ``nic<k>`` is the k-th), as the
        inventory names it. Unreadable parts are empty strings."""
        ports = self._ports if self._ports is not None else self.scan()
        found: dict[str, list[IbPort]] = {}
        for dev, n, p in ports:
            guid = _guid_of_gid(_read(p / "gids" / "0")) or _guid(_read(self.root / dev / "node_guid"))
            found.setdefault(dev, []).append(IbPort(n, guid, _read(p / "link_layer") or "InfiniBand"))
        out: list[NicUnit] = []
        for dev, dev_ports in found.items():
            link = self.root / dev / "device"
            target = link.resolve().name.lower() if link.is_symlink() else ""
            try:
                nets = sorted(q.name for q in (link / "net").iterdir())
            except OSError:
                nets = []
            pci = target if _PCI.fullmatch(target) else ""
            out.append(NicUnit(dev, nets[0] if nets else "", pci, "", tuple(dev_ports)))
        return tuple(out)


def _guid(text: str | None) -> str:
    """``9c63:c003:00ab:cd01`` -> ``0x9c63c00300abcd01``; "" for nothing or zero."""
    digits = (text or "").replace(":", "").lower()
    if len(digits) != 16 or not all(c in "0123456789abcdef" for c in digits) or not digits.strip("0"):
        return ""
    return "0x" + digits


def _guid_of_gid(gid: str | None) -> str:
    """The port GUID in a GID (``fe80:0000:0000:0000:9c63:c003:00ab:cd01``): its low 64 bits."""
    groups = (gid or "").split(":")
    return _guid(":".join(groups[4:])) if len(groups) == 8 else ""
