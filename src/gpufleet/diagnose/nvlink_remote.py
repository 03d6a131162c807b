"""Which GPU is on the other end of an NVSwitch port: ``nvidia-smi nvlink -R`` read backwards.

An SXid names a switch (``nvidia-nvswitch3``, its PCI address) and a port (``Link 28``); the fault may
be the switch's or the GPU's at the far end of that port, and the port number alone names neither.
On an NVSwitch board ``nvidia-smi nvlink -R`` prints, per GPU and per GPU link, the remote device's
PCI address and the remote link index, which is the switch port::

    GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-22e6cd4f-9e28-603b-8d78-a7fecfcade14)
             Link 0: Remote Device 00000000:CD:00.0: Link 25

:func:`parse_nvlink_remote` inverts it into :class:`SwitchPorts`: (switch PCI address, port) -> (GPU
index, GPU link). NVIDIA's NVSentinel maps SXids to GPUs the same way (its syslog health monitor,
``pkg/sxid/lsnvlink``). GPU-to-GPU links (``Remote Device GPU 1``, or a bridge's peer GPU, which is
never a switch an SXid names) are kept too and simply never asked for. Pure: parsing only; the caller
reads the file (``gpufleet diagnose --nvlink FILE``, the agent's ``nvlink_remote_file``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.diagnose.finding import normalise_pci
from gpufleet.domain.errors import InvalidInput

_GPU = re.compile(r"^\s*GPU (\d+):")
_LINK = re.compile(
    r"^\s*Link (\d+): Remote Device ((?:[0-9a-fA-F]{1,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): Link (\d+)\s*$"
)


@dataclass(frozen=True, slots=True)
class SwitchPorts:
    """(switch PCI address, port) -> (GPU index, GPU link), from one node's ``nvidia-smi nvlink -R``."""

    ports: Mapping[tuple[str, int], tuple[int, int]] = field(default_factory=dict)

    def peer(self, switch_pci: str, port: int) -> tuple[int, int] | None:
        """(GPU index, GPU link) on the far end of ``port`` of the switch at ``switch_pci``, or None."""
        pci = normalise_pci(switch_pci)
        return self.ports.get((pci, port)) if pci is not None else None

    def __len__(self) -> int:
        return len(self.ports)


def parse_nvlink_remote(text: str, source: str = "nvlink") -> SwitchPorts:
    """Read ``nvidia-smi nvlink -R`` output (other lines are ignored). A ``Link`` line before any
    ``GPU`` line, or two GPU links claiming one switch port, is an error naming the line."""
    ports: dict[tuple[str, int], tuple[int, int]] = {}
    gpu: int | None = None
    for n, line in enumerate(text.splitlines(), 1):
        g = _GPU.match(line)
        if g:
            gpu = int(g[1])
            continue
        m = _LINK.match(line)
        if m is None:
            continue
        if gpu is None:
            raise InvalidInput(f"{source} line {n}", line.strip(), "a 'GPU <index>: ...' line before its links")
        pci = normalise_pci(m[2])
        assert pci is not None  # the pattern only takes PCI addresses
        key, value = (pci, int(m[3])), (gpu, int(m[1]))
        if ports.get(key, value) != value:
            raise InvalidInput(f"{source} line {n}", line.strip(),
                               f"one GPU link per switch port ({pci} port {key[1]} is GPU {ports[key][0]}'s)")
        ports[key] = value
    return SwitchPorts(ports)


def load_nvlink_remote(path: str | Path, field_name: str = "--nvlink") -> SwitchPorts:
    """Read the file ``path`` holds (see :func:`parse_nvlink_remote`); it must name at least one link."""
    p = Path(path)
    if not p.is_file():
        raise InvalidInput(field_name, str(path), "an existing file with the output of nvidia-smi nvlink -R")
    ports = parse_nvlink_remote(p.read_text(encoding="utf-8", errors="replace"), field_name)
    if not ports:
        raise InvalidInput(field_name, str(path), "nvidia-smi nvlink -R output with 'Link N: Remote Device' lines")
    return ports
