"""Collect the node's inventory (``gpufleet.inventory/v1``, :mod:`gpufleet.domain.inventory`).

Once, after the device is opened (``gpufleet agent`` registers it with the controller through the push
client; ``gpufleet agent --print-inventory`` prints it):

* GPUs from the device port (:meth:`~gpufleet.agent.devices.port.Device.gpus`): NVML index, UUID, board
  serial, PCI address, model, NVLink count;
* NICs from the InfiniBand sysfs tree that the InfiniBand collector reads
  (:meth:`~gpufleet.agent.collectors.infiniband.InfinibandCollector.identities`), so ``nic<k>`` here is
  the ``nic<k>`` of the agent's InfiniBand events;
* the chassis serial from DMI: ``<sys_root>/class/dmi/id/product_serial``, else ``board_serial``, else "".

A simulated node (``--device sim``) has its own sysfs tree (:class:`~gpufleet.agent.devices.simhost.SimSysfs`),
read the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpufleet.agent.collectors.infiniband import InfinibandCollector
from gpufleet.agent.devices.port import Device
from gpufleet.domain.inventory import GpuUnit, NodeInventory

_UNSET = {"", "none", "not specified", "to be filled by o.e.m.", "default string", "0123456789"}


def collect_inventory(
    node: str,
    device: Device,
    *,
    ib_root: Path,
    sys_root: Path,
    include_ethernet: bool = False,
) -> NodeInventory:
    """The inventory of ``node``; ``device`` must be open (a device that failed to open has no GPUs)."""
    gpus = tuple(
        GpuUnit(index=g.index, uuid=g.uuid, serial=g.serial, pci=g.pci_bus_id, sku=g.name, nvlinks=g.nvlinks,
                nvlink_peers=g.nvlink_peers)
        for g in device.gpus()
    )
    nics = InfinibandCollector(ib_root, include_ethernet=include_ethernet).identities()
    return NodeInventory(node, chassis_serial(sys_root), gpus, nics)


def chassis_serial(sys_root: Path) -> str:
    """The DMI product serial, else the board serial; "" when neither says anything (firmware placeholders
    such as ``To Be Filled By O.E.M.`` count as nothing). Both files are readable by root only."""
    for name in ("product_serial", "board_serial"):
        try:
            text = (sys_root / "class" / "dmi" / "id" / name).read_text(errors="replace").strip()
        except OSError:
            continue
        if text.lower() not in _UNSET:
            return text
    return ""


def inventory_json(inventory: NodeInventory) -> str:
    """What ``--print-inventory`` prints."""
    return json.dumps(inventory.to_json(), indent=2)
