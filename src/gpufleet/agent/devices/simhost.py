"""The rest of a simulated node, beside its GPUs (``sim.py``): a sysfs tree and a kernel ring buffer.

Simulated faults reach the agent through its *real* collectors, so these are files laid out exactly as
the kernel lays them out:

* :class:`SimSysfs` — a ``/sys`` tree under ``root``: ``class/infiniband/mlx5_<k>`` (one ConnectX-7 NDR
  port each, as ``tests/fixtures/sysfs/h100-healthy``), its PCI device (``devices/pci0000:00/<pci>`` with
  ``net/<netdev>``, linked as ``class/infiniband/<hca>/device``) and ``class/dmi/id/product_serial``.
  :class:`~gpufleet.agent.collectors.infiniband.InfinibandCollector` reads ``ib_root``; the inventory
  reads the whole tree. :meth:`SimSysfs.ib_down` and :meth:`SimSysfs.ib_flap` change the port files.
* :class:`SimKernelLog` — a regular file of ``/dev/kmsg`` records (``<prio>,<seq>,<usec since boot>,-;
  <message>``) that :class:`~gpufleet.agent.collectors.kmsg.KmsgFollower` follows as its kernel ring
  (``--kmsg-path FILE``). The simulated driver writes its lines there as the NVIDIA driver prints them.

Serials: a simulated node's units take their serials from one prefix (:func:`serial_prefix`, by default
a hash of node name and seed): the chassis is ``<prefix>``, GPU ``i`` is ``<prefix>G<i>``, and the HCA
GUIDs derive from it. Giving agent B the prefix agent A had moves A's tray (chassis, GPUs, NICs) to B.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Collection
from datetime import datetime
from pathlib import Path

from gpufleet.agent.clock import AgentClock
from gpufleet.agent.collectors.infiniband import COUNTERS
from gpufleet.diagnose.kmsg import parse_kmsg_record
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.topology import natural_key

_NIC_BUSES = ("19", "2b", "3b", "5e", "9b", "ac", "bb", "dc")  # beside the GPUs of sim.py, one per rail
_XID_DETAIL = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Illegal Instruction Parameter",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f3a_1c000000. "
    "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, "
    "subpartition 0.",
    63: "Row Remapper: New row (0x0000000000c3f1a0) was marked for remapping, reset gpu to activate.",
    74: "NVLink: fatal error detected on link 0(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    94: "Contained: CE User Channel (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    109: "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x1c000",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) "
    "(0x20800a4c 0x4).",
}


def serial_prefix(node: str, seed: int) -> str:
    """The default serial prefix of simulated node ``node`` (deterministic per node and seed)."""
    return "SIM" + hashlib.sha1(f"{node}/{seed}".encode()).hexdigest()[:10].upper()


def gpu_serials(prefix: str, gpus: int) -> tuple[str, ...]:
    return tuple(f"{prefix}G{i}" for i in range(gpus))


def xid_message(pci: str, code: int, detail: str = "") -> str:
    """An XID line as the NVIDIA driver prints it (``NVRM: Xid (PCI:0000:18:00): 94, pid=..., ...``)."""
    short = pci.rpartition(".")[0] or pci  # the driver prints domain:bus:device, without the function
    who = "pid='<unknown>', name=<unknown>" if code == 79 else "pid=4242, name=python3"
    text = detail or _XID_DETAIL.get(code, "Ch 00000008")
    return f"NVRM: Xid (PCI:{short}): {code}, {who}, {text}"


class SimKernelLog:
    """Appends ``/dev/kmsg`` records to ``path``; times are microseconds since ``boot`` on ``clock``."""

    def __init__(self, path: Path, clock: AgentClock, boot: datetime) -> None:
        self.path, self.clock, self.boot = path, clock, boot
        try:
            path.touch(exist_ok=True)
            self.seq = _last_seq(path)
        except OSError as err:
            raise InvalidInput(
                "--kmsg-path", str(path), f"a writable file for the simulated kernel log ({err})"
            ) from None

    def write(self, message: str, level: int = 4) -> None:
        self.seq += 1  # continues after the file's last record: the follower skips what it has seen
        usec = max(0, int((self.clock.now() - self.boot).total_seconds() * 1_000_000))
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(f"{level},{self.seq},{usec},-;{message}\n")

    def xid(self, pci: str, code: int, detail: str = "") -> None:
        self.write(xid_message(pci, code, detail))

    def fell_off_bus(self, pci: str) -> None:
        self.write(f"NVRM: GPU {pci}: GPU has fallen off the bus.", level=3)


def _last_seq(path: Path) -> int:
    with path.open("rb") as fh:
        fh.seek(max(0, path.stat().st_size - 65536))
        tail = fh.read().split(b"\n")
    seqs = [rec.seq for rec in map(parse_kmsg_record, tail) if rec is not None]
    return max(seqs, default=0)


class SimSysfs:
    """A ``/sys`` tree with ``nics`` InfiniBand HCAs and a DMI chassis serial, created under ``root``.
    ``absent``: slots (0 .. ``nics`` - 1) whose HCA does not probe, as after a reboot without it: the HCAs
    after it keep their PCI addresses and GUIDs and are named one lower (``mlx5_<k>``), as the driver does."""

    def __init__(self, root: Path, *, nics: int, serial: str, absent: Collection[int] = ()) -> None:
        if nics < 0:
            raise InvalidInput("sim_nics", nics, "a NIC count of 0 or more")
        for slot in absent:
            if not 0 <= slot < nics:
                raise InvalidInput("sim_absent", f"nic{slot}", f"a NIC slot nic0 .. nic{nics - 1}")
        self._absent = frozenset(absent)
        self.root = root
        self.ib_root = root / "class" / "infiniband"
        self.serial = serial
        try:
            self._build(nics)
        except OSError as err:
            raise InvalidInput(
                "state_dir", str(root), f"a writable directory for the simulated sysfs ({err})"
            ) from None

    def _build(self, nics: int) -> None:
        dmi = self.root / "class" / "dmi" / "id"
        dmi.mkdir(parents=True, exist_ok=True)
        (dmi / "product_serial").write_text(f"{self.serial}\n")
        self.ib_root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.ib_root)  # a restarted simulated node comes back healthy
        self.ib_root.mkdir()
        for k in (k for k in range(nics) if k not in self._absent):
            bus = _NIC_BUSES[k] if k < len(_NIC_BUSES) else f"{0x60 + k:02x}"
            pci = f"0000:{bus}:00.0"
            pdev = self.root / "devices" / "pci0000:00" / pci
            (pdev / "net" / f"ibp{int(bus, 16)}s0").mkdir(parents=True, exist_ok=True)
            hca = self.ib_root / f"mlx5_{sum(1 for j in range(k) if j not in self._absent)}"
            hca.mkdir()
            guid = hashlib.sha1(f"{self.serial}:nic{k}".encode()).hexdigest()[:16]
            guid_text = ":".join(guid[i : i + 4] for i in range(0, 16, 4))
            (hca / "device").symlink_to(os.path.relpath(pdev, hca))
            for name, value in (
                ("node_guid", guid_text),
                ("node_type", "1: CA"),
                ("fw_ver", "28.41.1000"),
                ("hca_type", "MT4129"),
                ("board_id", "MT_0000000838"),
            ):
                (hca / name).write_text(f"{value}\n")
            port = hca / "ports" / "1"
            (port / "counters").mkdir(parents=True)
            (port / "gids").mkdir()
            (port / "gids" / "0").write_text(f"fe80:0000:0000:0000:{guid_text}\n")
            for name, value in (
                ("state", "4: ACTIVE"),
                ("phys_state", "5: LinkUp"),
                ("link_layer", "InfiniBand"),
                ("rate", "400 Gb/sec (4X NDR)"),
                ("lid", f"0x{k + 1:x}"),
            ):
                (port / name).write_text(f"{value}\n")
            for c in COUNTERS:
                (port / "counters" / c).write_text("0\n")

    def hcas(self) -> list[str]:
        """HCA names in the order the InfiniBand collector reads them (``nic<k>`` is the k-th)."""
        return sorted((p.name for p in self.ib_root.iterdir()), key=natural_key)

    def ib_down(self, nic: int) -> None:
        """The port goes down and stays down (``1: DOWN`` / ``3: Disabled``)."""
        port = self._port(nic)
        (port / "state").write_text("1: DOWN\n")
        (port / "phys_state").write_text("3: Disabled\n")

    def ib_flap(self, nic: int, count: int = 1) -> None:
        """The port went down and came back ``count`` times (``link_downed`` grows)."""
        self.add_to_counter(nic, "link_downed", count)

    def add_to_counter(self, nic: int, counter: str, count: int) -> None:
        """Port counter ``counter`` (one of the collector's ``COUNTERS``) grows by ``count``."""
        if counter not in COUNTERS:
            raise InvalidInput("counter", counter, f"one of {', '.join(COUNTERS)}")
        f = self._port(nic) / "counters" / counter
        f.write_text(f"{int(f.read_text()) + count}\n")

    def _port(self, nic: int) -> Path:
        names = self.hcas()
        if not 0 <= nic < len(names):
            raise InvalidInput("nic", nic, f"a NIC index between 0 and {len(names) - 1}")
        return self.ib_root / names[nic] / "ports" / "1"
