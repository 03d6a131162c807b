"""The node's inventory: GPUs from the device port, HCAs from InfiniBand sysfs, the chassis serial from DMI;
and ``gpufleet agent --print-inventory`` through the real Typer app."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pynvml
import pytest
from typer.testing import CliRunner

from gpufleet.agent.clock import FakeClock
from gpufleet.agent.collectors.infiniband import InfinibandCollector
from gpufleet.agent.devices.sim import SimDevice
from gpufleet.agent.devices.simhost import SimSysfs
from gpufleet.agent.inventory import chassis_serial, collect_inventory
from gpufleet.cli import app
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.inventory import IbPort, NicUnit, parse_inventory
from tests.unit.agent.fake_nvml import nvml_over_sim

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "sysfs"
runner = CliRunner()


def test_nics_from_the_recorded_tree_use_the_node_guid(tmp_path: Path) -> None:
    inv = collect_inventory("n1", SimDevice(0), ib_root=FIX / "h100-healthy", sys_root=tmp_path)
    assert [n.device for n in inv.nics] == [f"mlx5_{k}" for k in range(8)]  # the RoCE bond is not a rail
    assert inv.nics[0] == NicUnit("mlx5_0", ports=(IbPort(1, "0xa088c20300001a2b", "InfiniBand"),))
    assert inv.serial == "" and inv.gpus == ()


def test_port_guid_pci_address_and_netdev(tmp_path: Path) -> None:
    pdev = tmp_path / "devices/pci0000:00/0000:9a:00.1"
    (pdev / "net/ibp154s0f1").mkdir(parents=True)
    port = tmp_path / "class/infiniband/mlx5_3/ports/1"
    (port / "gids").mkdir(parents=True)
    (port / "gids/0").write_text("fe80:0000:0000:0000:9c63:c003:00ab:cd01\n")
    (port / "link_layer").write_text("InfiniBand\n")
    (port.parents[1] / "node_guid").write_text("9c63:c003:00ab:cd00\n")
    (port.parents[1] / "device").symlink_to(os.path.relpath(pdev, port.parents[1]))
    [nic] = InfinibandCollector(tmp_path / "class/infiniband").identities()
    assert nic == NicUnit("mlx5_3", "ibp154s0f1", "0000:9a:00.1", "", (IbPort(1, "0x9c63c00300abcd01", "InfiniBand"),))


@pytest.mark.parametrize(
    ("product", "board", "serial"),
    [("NODE-00017", "BRD-1", "NODE-00017"), ("To Be Filled By O.E.M.", "BRD-1", "BRD-1"), (None, None, "")],
)
def test_chassis_serial_from_dmi(tmp_path: Path, product: str | None, board: str | None, serial: str) -> None:
    dmi = tmp_path / "class/dmi/id"
    dmi.mkdir(parents=True)
    for name, value in (("product_serial", product), ("board_serial", board)):
        if value is not None:
            (dmi / name).write_text(value + "\n")
    assert chassis_serial(tmp_path) == serial


def test_nvml_serials_and_a_board_without_one(tmp_path: Path) -> None:
    dev, sim, lib = nvml_over_sim(3)
    lib.fail("nvmlDeviceGetSerial", pynvml.NVML_ERROR_NOT_SUPPORTED, index=2)
    assert dev.open().ok
    inv = collect_inventory("n1", dev, ib_root=tmp_path / "none", sys_root=tmp_path)
    assert [g.serial for g in inv.gpus] == [sim.state[0].serial, sim.state[1].serial, ""]
    assert [(g.index, g.uuid, g.pci) for g in inv.gpus] == [(g.index, g.uuid, g.pci_bus_id) for g in sim.state]
    assert inv.gpus[0].sku == "NVIDIA H100 80GB HBM3" and inv.gpus[0].nvlinks == 18
    # NVLink peers: the NVSwitch at each link's far end, as NVML reports it (normalised addresses)
    assert inv.gpus[1].nvlink_peers == tuple(lk.peer for lk in sim.state[1].links)
    assert len(set(inv.gpus[1].nvlink_peers)) > 1 and all(p.startswith("0000:") for p in inv.gpus[1].nvlink_peers)
    dev2, _, lib2 = nvml_over_sim(1)
    lib2.fail("nvmlDeviceGetNvLinkRemotePciInfo", pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert dev2.open().ok  # a driver without remote PCI info: no peers, everything else as before
    assert collect_inventory("n1", dev2, ib_root=tmp_path / "none", sys_root=tmp_path).gpus[0].nvlink_peers == ()


def test_simulated_node_round_trips_through_the_interchange_format(tmp_path: Path) -> None:
    sysfs = SimSysfs(tmp_path, nics=2, serial="TRAY7")
    dev = SimDevice(2, clock=FakeClock(), serials=["TRAY7G0", "TRAY7G1"])
    dev.open()
    inv = collect_inventory("r01-n03", dev, ib_root=sysfs.ib_root, sys_root=sysfs.root)
    assert inv.serial == "TRAY7" and [g.serial for g in inv.gpus] == ["TRAY7G0", "TRAY7G1"]
    assert [(n.device, n.pci, n.netdev) for n in inv.nics] == [
        ("mlx5_0", "0000:19:00.0", "ibp25s0"),
        ("mlx5_1", "0000:2b:00.0", "ibp43s0"),
    ]
    assert parse_inventory(json.loads(json.dumps(inv.to_json()))) == inv


def _print(*args: str) -> dict[str, object]:
    res = runner.invoke(app, ["agent", "--device", "sim", "--print-inventory", *args])
    assert res.exit_code == 0, res.output
    doc: dict[str, object] = json.loads(res.stdout)
    return doc


def test_print_inventory_cli_and_a_tray_moved_by_its_serial_prefix(tmp_path: Path) -> None:
    a = _print("--gpus", "4", "--node", "r01-n01", "--state-dir", str(tmp_path))
    assert a == _print("--gpus", "4", "--node", "r01-n01", "--state-dir", str(tmp_path))  # deterministic
    assert a["format"] == "gpufleet.inventory/v1" and a["node"] == "r01-n01"
    gpus, nics = a["gpus"], a["nics"]
    assert isinstance(gpus, list) and isinstance(nics, list) and len(gpus) == 4 and len(nics) == 4
    assert {"index", "uuid", "serial", "pci"} <= set(gpus[0]) and nics[0]["ports"][0]["guid"].startswith("0x")
    b = _print("--gpus", "4", "--node", "r02-n07", "--state-dir", str(tmp_path))
    assert b["serial"] != a["serial"] and not {g["serial"] for g in gpus} & {g["serial"] for g in b["gpus"]}  # type: ignore[attr-defined]
    moved = _print("--gpus", "4", "--node", "r02-n07", "--sim-serial-prefix", str(a["serial"]))
    assert moved["serial"] == a["serial"] and moved["gpus"] == gpus and moved["nics"] == nics
    one = _print("--gpus", "2", "--node", "r02-n07", "--sim-gpu-serials", f",{gpus[0]['serial']}")
    assert one["gpus"][1]["serial"] == gpus[0]["serial"] and one["gpus"][0]["serial"] != gpus[0]["serial"]  # type: ignore[index]


def test_inject_with_nvml_names_the_option() -> None:
    res = runner.invoke(app, ["agent", "--device", "nvml", "--inject", "xid:94@gpu1", "--print-inventory"])
    assert isinstance(res.exception, InvalidInput) and res.exception.field == "--inject"
    assert "--device sim" in res.exception.expected


def test_a_simulated_node_without_a_gpu_and_an_hca_numbers_the_later_ones_lower(tmp_path: Path) -> None:
    full_dev, full_sys = SimDevice(8), SimSysfs(tmp_path / "full", nics=8, serial="SIMX")
    short_dev, short_sys = SimDevice(8, absent={3}), SimSysfs(tmp_path / "short", nics=8, serial="SIMX", absent={2})
    full_dev.open()
    short_dev.open()
    full = collect_inventory("n1", full_dev, ib_root=full_sys.ib_root, sys_root=full_sys.root)
    short = collect_inventory("n1", short_dev, ib_root=short_sys.ib_root, sys_root=short_sys.root)
    assert [g.index for g in short.gpus] == list(range(7))
    assert [(g.pci, g.serial) for g in short.gpus] == [(g.pci, g.serial) for g in full.gpus if g.index != 3]
    assert [n.device for n in short.nics] == [f"mlx5_{k}" for k in range(7)]  # named in probe order
    assert [(n.pci, n.ports) for n in short.nics] == [(n.pci, n.ports) for n in full.nics if n.device != "mlx5_2"]
    with pytest.raises(InvalidInput) as err:
        SimDevice(8, absent={8})
    assert (err.value.field, err.value.value) == ("sim_absent", "gpu8")
    with pytest.raises(InvalidInput) as err:
        SimSysfs(tmp_path / "bad", nics=2, serial="SIMX", absent={2})
    assert (err.value.field, err.value.value) == ("sim_absent", "nic2")


def test_sim_absent_names_gpu_and_nic_slots(tmp_path: Path) -> None:
    from gpufleet.agent.config import load_config

    cfg = tmp_path / "agent.toml"
    cfg.write_text('sim_absent = ["gpu3", "nic2"]\n')
    assert load_config(cfg).sim_absent == ["gpu3", "nic2"]
    cfg.write_text('sim_absent = ["gpu3", "hca2"]\n')
    with pytest.raises(InvalidInput) as err:
        load_config(cfg)
    assert err.value.field.startswith("sim_absent") and "hca2" in str(err.value)
