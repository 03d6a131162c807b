from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.clock import FakeClock
from gpufleet.agent.collectors.host import HostCollector
from gpufleet.agent.collectors.infiniband import InfinibandCollector
from gpufleet.agent.devices.sim import SimDevice
from gpufleet.agent.exporter import make_registry
from gpufleet.agent.runner import Agent
from gpufleet.agent.spool import Spool

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "sysfs"


def scrape(tmp_path: Path) -> dict[str, list[tuple[dict[str, str], float]]]:
    clock = FakeClock()
    sim = SimDevice(4, clock=clock)
    spool = Spool(tmp_path / "s.db")
    agent = Agent(
        "r01-n003",
        sim,
        clock,
        ib=InfinibandCollector(FIX / "h100-degraded"),
        spool=spool,
        host=HostCollector(tmp_path, {"data": str(tmp_path), "checkpoint": str(tmp_path / "nope")}),
    )
    agent.open()
    sim.add_ecc(1, sbe=12, dbe=1)
    sim.set_row_remap(2, failure=True)
    sim.nvlink_down(0, 3)
    sim.add_nvlink_errors(0, 4, crc_flit=5)
    sim.thermal_excursion(1)
    agent.tick()
    for code in (31, 31, 31, 43):
        sim.inject_xid(0, code)
    sim.fall_off_bus(3)
    agent.handle_xids(sim.wait_xids(0))
    clock.advance(1)
    agent.tick()
    text = generate_latest(make_registry(agent.telemetry, spool)).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def one(series: list[tuple[dict[str, str], float]], **match: str) -> float:
    vals = [v for lab, v in series if all(lab.get(k) == want for k, want in match.items())]
    assert len(vals) == 1, (match, series)
    return vals[0]


def test_dcgm_names_and_labels(tmp_path: Path) -> None:
    m = scrape(tmp_path)
    util = m["DCGM_FI_DEV_GPU_UTIL"]
    assert {lab["gpu"] for lab, _ in util} == {"0", "1", "2"}  # GPU 3 is lost: no stale values
    lab = util[0][0]
    assert set(lab) == {"gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id"}
    assert lab["device"] == f"nvidia{lab['gpu']}" and lab["Hostname"] == "r01-n003"
    assert lab["modelName"] == "NVIDIA H100 80GB HBM3" and lab["pci_bus_id"] == "0000:18:00.0"
    for name in (
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_MEM_CLOCK",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
    ):
        assert name in m, name


def test_ecc_remap_nvlink_and_thermal_values(tmp_path: Path) -> None:
    m = scrape(tmp_path)
    assert one(m["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"], gpu="1") == 1
    assert one(m["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"], gpu="1") == 12
    assert one(m["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"], gpu="1") == 1
    assert one(m["DCGM_FI_DEV_ROW_REMAP_PENDING"], gpu="1") == 1
    assert one(m["DCGM_FI_DEV_ROW_REMAP_FAILURE"], gpu="2") == 1
    assert one(m["DCGM_FI_DEV_ROW_REMAP_FAILURE"], gpu="0") == 0
    assert one(m["gpufleet_gpu_nvlink_up"], gpu="0", link="3") == 0
    assert one(m["gpufleet_gpu_nvlink_up"], gpu="0", link="2") == 1
    assert one(m["gpufleet_gpu_nvlink_errors"], gpu="0", link="4", type="crc_flit") == 5
    assert one(m["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"], gpu="0") == 5
    assert one(m["gpufleet_gpu_clock_throttle"], gpu="1", reason="hw_thermal_slowdown") == 1
    assert one(m["DCGM_FI_DEV_GPU_TEMP"], gpu="1") >= 90


def test_xid_counter_counts_every_event_per_code(tmp_path: Path) -> None:
    m = scrape(tmp_path)
    xid = m["gpufleet_gpu_xid_errors_total"]
    assert one(xid, gpu="0", xid="31") == 3
    assert one(xid, gpu="0", xid="43") == 1
    assert one(xid, gpu="3", xid="79") == 1
    assert one(m["DCGM_FI_DEV_XID_ERRORS"], gpu="0") == 43  # dcgm-compatible: the last one
    assert one(m["gpufleet_gpu_lost"], gpu="3") == 1 and one(m["gpufleet_gpu_lost"], gpu="0") == 0


def test_ib_host_and_agent_series(tmp_path: Path) -> None:
    m = scrape(tmp_path)
    assert one(m["gpufleet_ib_port_active"], device="mlx5_2", port="1") == 0
    assert one(m["gpufleet_ib_port_state"], device="mlx5_0") == 4
    assert one(m["gpufleet_ib_port_rate_gbps"], device="mlx5_5") == 200
    assert one(m["gpufleet_ib_symbol_error"], device="mlx5_6") == 65535
    assert one(m["gpufleet_ib_excessive_buffer_overrun_errors"], device="mlx5_6") == 7
    assert one(m["gpufleet_host_mount_present"], role="checkpoint") == 0
    assert one(m["gpufleet_host_mount_present"], role="data") == 1
    assert one(m["gpufleet_agent_device_up"]) == 1 and one(m["gpufleet_agent_gpus"]) == 4
    assert one(m["gpufleet_agent_events_total"], kind="xid") == 5
    assert one(m["gpufleet_agent_spool_events"]) > 0


def test_openmetrics_exposition_is_valid(tmp_path: Path) -> None:
    """Prometheus negotiates OpenMetrics: the output must parse as such (counters end in _total)."""
    clock = FakeClock()
    sim = SimDevice(2, clock=clock)
    agent = Agent("n1", sim, clock)
    agent.open()
    sim.inject_xid(1, 94)
    agent.handle_xids(sim.wait_xids(0))
    agent.tick()
    text = generate_openmetrics(make_registry(agent.telemetry)).decode()
    fams = {f.name: f for f in parse_openmetrics(text)}
    assert fams["gpufleet_gpu_xid_errors"].type == "counter"
    assert fams["DCGM_FI_DEV_GPU_UTIL"].type == "gauge"


def test_a_port_already_taken_or_a_foreign_address_is_invalid_input_naming_the_setting() -> None:
    import socket

    import pytest

    from gpufleet.agent.exporter import make_registry, serve
    from gpufleet.agent.telemetry import Telemetry
    from gpufleet.domain.errors import InvalidInput

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        with pytest.raises(InvalidInput) as err:
            serve(make_registry(Telemetry(hostname="n1")), port, "127.0.0.1")
        assert err.value.field == "metrics_port" and err.value.value == port
    finally:
        taken.close()
    with pytest.raises(InvalidInput) as err:
        serve(make_registry(Telemetry(hostname="n1")), 0, "not an address")
    assert err.value.field == "metrics_addr"
