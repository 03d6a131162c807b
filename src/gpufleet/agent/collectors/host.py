"""Host health: EDAC memory-controller error counts and free space on the data and checkpoint mounts.

EDAC: ``<sys>/devices/system/edac/mc/mc<N>/{ce_count,ue_count}`` (Linux ``Documentation/admin-guide/
ras.rst``). Mounts: ``statvfs`` of each configured path (injectable, as is the sysfs root).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class EdacReading:
    mc: str  # "mc0"
    correctable: int | None
    uncorrectable: int | None


@dataclass(frozen=True, slots=True)
class MountReading:
    role: str  # "data", "checkpoint"
    path: str
    present: bool
    free_bytes: int | None = None
    total_bytes: int | None = None

    @property
    def free_fraction(self) -> float | None:
        if not self.free_bytes or not self.total_bytes:
            return 0.0 if self.present and self.total_bytes else None
        return self.free_bytes / self.total_bytes


@dataclass(frozen=True, slots=True)
class HostReading:
    edac: tuple[EdacReading, ...]
    mounts: tuple[MountReading, ...]


def _int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class HostCollector:
    def __init__(
        self,
        sys_root: Path = Path("/sys"),
        mounts: Mapping[str, str] | None = None,
        statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
    ) -> None:
        self.sys_root = sys_root
        self.mounts = dict(mounts or {})
        self._statvfs = statvfs

    def read(self) -> HostReading:
        edac: list[EdacReading] = []
        mc_root = self.sys_root / "devices" / "system" / "edac" / "mc"
        if mc_root.is_dir():
            for mc in sorted(mc_root.glob("mc[0-9]*")):
                edac.append(EdacReading(mc.name, _int(mc / "ce_count"), _int(mc / "ue_count")))
        mounts: list[MountReading] = []
        for role, path in sorted(self.mounts.items()):
            try:
                st = self._statvfs(path)
            except OSError:
                mounts.append(MountReading(role, path, False))
                continue
            mounts.append(MountReading(role, path, True, st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize))
        return HostReading(tuple(edac), tuple(mounts))
