"""What a node says it is made of: the agent's inventory report (``gpufleet.inventory/v1``).

The agent collects it on start (NVML for GPUs, sysfs for InfiniBand HCAs, DMI for the chassis serial)
and registers it with the controller, which maps it onto topology ids (``controller/identity.py``)
and notices hardware that moved (a serial seen at a new slot). ``gpufleet agent --print-inventory``
prints the same JSON::

    {"format": "gpufleet.inventory/v1", "node": "r01-n03", "serial": "NODE-00017",
     "gpus": [{"index": 0, "uuid": "GPU-5d1e...", "serial": "1654922006281", "pci": "0000:18:00.0",
               "sku": "NVIDIA H100 80GB HBM3", "nvlinks": 18, "nvlink_peers": ["0000:05:00.0", "..."]}],
     "nics": [{"device": "mlx5_0", "netdev": "ibp24s0", "pci": "0000:18:00.1",
               "ports": [{"port": 1, "guid": "0x9c63c00300abcd01", "link_layer": "InfiniBand"}]}]}

Pure: parsing raises :class:`~gpufleet.domain.errors.InvalidInput` naming the field, the value and
what was expected; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.text import REF_MAX, check_text
from gpufleet.domain.topology import natural_key

FORMAT = "gpufleet.inventory/v1"
_MAX_INT = 2**31 - 1  # GPU indexes, NVLink and port counts: small numbers; this keeps ids short


@dataclass(frozen=True, slots=True)
class GpuUnit:
    index: int  # NVML index (PCI bus order)
    uuid: str = ""
    serial: str = ""  # board serial: names the physical unit
    pci: str = ""  # normalised dddd:bb:dd.f
    sku: str = ""
    nvlinks: int = 0
    nvlink_peers: tuple[str, ...] = ()  # per NVLink: the PCI address at its other end, where NVML exposes it


@dataclass(frozen=True, slots=True)
class IbPort:
    port: int
    guid: str = ""
    link_layer: str = ""


@dataclass(frozen=True, slots=True)
class NicUnit:
    device: str  # the HCA name, e.g. mlx5_0
    netdev: str = ""
    pci: str = ""
    serial: str = ""
    ports: tuple[IbPort, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """One node's units, GPUs by NVML index and HCAs in natural name order (``mlx5_2`` before
    ``mlx5_10``), however they were given: the order the controller maps onto slots."""

    node: str
    serial: str = ""  # the chassis / compute tray serial (DMI)
    gpus: tuple[GpuUnit, ...] = ()
    nics: tuple[NicUnit, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", tuple(sorted(self.gpus, key=lambda g: g.index)))
        object.__setattr__(self, "nics", tuple(sorted(self.nics, key=lambda n: natural_key(n.device))))

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "node": self.node,
            "serial": self.serial,
            "gpus": [
                {"index": g.index, "uuid": g.uuid, "serial": g.serial, "pci": g.pci, "sku": g.sku,
                 "nvlinks": g.nvlinks, "nvlink_peers": list(g.nvlink_peers)}
                for g in self.gpus
            ],
            "nics": [
                {"device": n.device, "netdev": n.netdev, "pci": n.pci, "serial": n.serial,
                 "ports": [{"port": p.port, "guid": p.guid, "link_layer": p.link_layer} for p in n.ports]}
                for n in self.nics
            ],
        }


def parse_inventory(obj: Any, where: str = "inventory") -> NodeInventory:
    """Validate a decoded JSON inventory; every problem names its field (``inventory.gpus[2].index``)."""
    d = _obj(obj, where)
    _only(d, where, {"format", "node", "serial", "gpus", "nics"})
    fmt = d.get("format", FORMAT)
    if fmt != FORMAT:
        raise InvalidInput(f"{where}.format", fmt, FORMAT)
    node = _str(d, "node", where, required=True)
    gpus: list[GpuUnit] = []
    for i, g in enumerate(_list(d, "gpus", where)):
        p = f"{where}.gpus[{i}]"
        gd = _obj(g, p)
        _only(gd, p, {"index", "uuid", "serial", "pci", "sku", "nvlinks", "nvlink_peers"})
        peers = _list(gd, "nvlink_peers", p)
        for k, peer in enumerate(peers):
            if not isinstance(peer, str):
                raise InvalidInput(f"{p}.nvlink_peers[{k}]", peer, "a PCI address string (\"\" when unknown)")
        gpus.append(GpuUnit(_int(gd, "index", p, required=True), _str(gd, "uuid", p), _str(gd, "serial", p),
                            _str(gd, "pci", p).lower(), _str(gd, "sku", p), _int(gd, "nvlinks", p),
                            tuple(x.lower() for x in peers)))
    seen = [g.index for g in gpus]
    for i, idx in enumerate(seen):
        if idx in seen[:i]:
            raise InvalidInput(f"{where}.gpus[{i}].index", idx, "an index not used by another GPU")
    nics: list[NicUnit] = []
    for i, n in enumerate(_list(d, "nics", where)):
        p = f"{where}.nics[{i}]"
        nd = _obj(n, p)
        _only(nd, p, {"device", "netdev", "pci", "serial", "ports"})
        ports = []
        for k, port in enumerate(_list(nd, "ports", p)):
            pp = f"{p}.ports[{k}]"
            pd = _obj(port, pp)
            _only(pd, pp, {"port", "guid", "link_layer"})
            ports.append(IbPort(_int(pd, "port", pp, required=True), _str(pd, "guid", pp), _str(pd, "link_layer", pp)))
        nics.append(NicUnit(_str(nd, "device", p, required=True), _str(nd, "netdev", p), _str(nd, "pci", p).lower(),
                            _str(nd, "serial", p), tuple(ports)))
    return NodeInventory(node, _str(d, "serial", where), tuple(gpus), tuple(nics))


def _obj(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise InvalidInput(where, v, "a JSON object")
    return v


def _only(d: dict[str, Any], where: str, allowed: set[str]) -> None:
    for k, v in d.items():
        if k not in allowed:
            raise InvalidInput(f"{where}.{k}", v, f"one of the fields {sorted(allowed)}")


def _list(d: dict[str, Any], key: str, where: str) -> list[Any]:
    v = d.get(key, [])
    if not isinstance(v, list):
        raise InvalidInput(f"{where}.{key}", v, "a JSON array")
    return v


def _str(d: dict[str, Any], key: str, where: str, *, required: bool = False) -> str:
    v = d.get(key)
    if v is None and not required:
        return ""
    if not isinstance(v, str) or (required and not v):
        raise InvalidInput(f"{where}.{key}", v, "a non-empty string" if required else "a string")
    return check_text(f"{where}.{key}", v, REF_MAX)


def _int(d: dict[str, Any], key: str, where: str, *, required: bool = False) -> int:
    v = d.get(key)
    if v is None and not required:
        return 0
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= _MAX_INT:
        raise InvalidInput(f"{where}.{key}", v, f"an integer from 0 to {_MAX_INT}")
    return v
