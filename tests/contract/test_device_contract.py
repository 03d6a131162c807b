"""One contract, two devices: the simulator and NVML (through pynvml's surface, on a FakeNvml double).

Faults are injected on the SimDevice that holds the state; the device under test must report them the
same way. With a real driver present (a GPU session), the real-NVML smoke test at the end runs too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from gpufleet.agent.clock import FakeClock
from gpufleet.agent.devices.port import THERMAL_THROTTLE, Device, ThrottleReason
from gpufleet.agent.devices.sim import SimDevice
from gpufleet.domain.errors import InvalidInput
from tests.unit.agent.fake_nvml import nvml_over_sim

N = 4


def _sim() -> tuple[Device, SimDevice]:
    sim = SimDevice(N, seed=3, clock=FakeClock())
    return sim, sim


def _nvml() -> tuple[Device, SimDevice]:
    dev, sim, _ = nvml_over_sim(N, seed=3)
    return dev, sim


@pytest.fixture(params=[_sim, _nvml], ids=["sim", "nvml"])
def pair(request: pytest.FixtureRequest) -> tuple[Device, SimDevice]:
    factory: Callable[[], tuple[Device, SimDevice]] = request.param
    dev, sim = factory()
    status = dev.open()
    assert status.ok, status.message
    return dev, sim


def test_enumerates_gpus_with_identity(pair: tuple[Device, SimDevice]) -> None:
    dev, _ = pair
    gpus = dev.gpus()
    assert [g.index for g in gpus] == list(range(N))
    assert len({g.uuid for g in gpus}) == N
    assert len({g.serial for g in gpus}) == N and all(g.serial for g in gpus)  # board serials name the units
    for g in gpus:
        assert re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]", g.pci_bus_id), g.pci_bus_id
        assert g.uuid.startswith("GPU-")
        assert "H100" in g.name
        assert g.nvlinks == 18


def test_fast_reading_is_realistic(pair: tuple[Device, SimDevice]) -> None:
    dev, _ = pair
    for i in range(N):
        r = dev.read_fast(i)
        assert not r.lost and r.errors == ()
        assert r.util_gpu_pct is not None and 0 <= r.util_gpu_pct <= 100
        assert r.mem_used_bytes is not None and r.mem_total_bytes is not None
        assert 0 < r.mem_used_bytes <= r.mem_total_bytes
        assert r.temp_gpu_c is not None and 20 <= r.temp_gpu_c <= 85
        assert r.temp_hbm_c is not None and r.temp_hbm_c >= r.temp_gpu_c - 2
        assert r.power_w is not None and 50 <= r.power_w <= 700
        assert r.sm_clock_mhz is not None and 300 <= r.sm_clock_mhz <= 1980
        assert r.mem_clock_mhz == 2619
        assert r.throttle_reasons is not None and not r.throttle_reasons & THERMAL_THROTTLE


def test_slow_reading_is_realistic(pair: tuple[Device, SimDevice]) -> None:
    dev, _ = pair
    r = dev.read_slow(0)
    assert not r.lost
    assert (r.pcie_gen_max, r.pcie_width_max, r.pcie_width) == (5, 16, 16)
    assert r.ecc_dbe_aggregate == 0 and r.ecc_sbe_aggregate is not None
    assert r.remap_pending is False and r.remap_failure is False
    assert len(r.nvlinks) == 18 and all(lk.up for lk in r.nvlinks)


def test_xid_arrives_once(pair: tuple[Device, SimDevice]) -> None:
    dev, sim = pair
    assert dev.wait_xids(0.5) == []
    sim.inject_xid(2, 31)
    sim.inject_xid(0, 94)
    got = dev.wait_xids(0.5)
    assert [(x.index, x.code) for x in got] == [(2, 31), (0, 94)]
    assert all(x.time.tzinfo is not None for x in got)
    assert dev.wait_xids(0.5) == []


def test_ecc_growth_and_row_remap(pair: tuple[Device, SimDevice]) -> None:
    dev, sim = pair
    before = dev.read_slow(1)
    sim.add_ecc(1, sbe=250, dbe=2)
    after = dev.read_slow(1)
    assert after.ecc_sbe_aggregate == (before.ecc_sbe_aggregate or 0) + 250
    assert after.ecc_sbe_volatile == 250
    assert after.ecc_dbe_aggregate == 2 and after.ecc_dbe_volatile == 2
    assert after.remap_uncorrectable == 2 and after.remap_pending is True
    sim.set_row_remap(1, failure=True)
    assert dev.read_slow(1).remap_failure is True
    assert dev.read_slow(0).remap_failure is False


def test_retired_pages(pair: tuple[Device, SimDevice]) -> None:
    dev, sim = pair
    sim.retire_pages(3, sbe=2, dbe=1)
    r = dev.read_slow(3)
    assert (r.retired_pages_sbe, r.retired_pages_dbe, r.retired_pages_pending) == (2, 1, True)


def test_thermal_excursion_throttles(pair: tuple[Device, SimDevice]) -> None:
    dev, sim = pair
    cool = dev.read_fast(0)
    sim.thermal_excursion(0, 95.0)
    hot = dev.read_fast(0)
    assert hot.temp_gpu_c is not None and hot.temp_gpu_c >= 94
    assert hot.throttle_reasons is not None and hot.throttle_reasons & ThrottleReason.HW_THERMAL_SLOWDOWN
    assert hot.sm_clock_mhz is not None and cool.sm_clock_mhz is not None
    assert hot.sm_clock_mhz < cool.sm_clock_mhz


def test_pcie_degradation(pair: tuple[Device, SimDevice]) -> None:
    dev, sim = pair
    sim.degrade_pcie(2, width=8, gen=3)
    sim.add_pcie_replays(2, 40)
    r = dev.read_slow(2)
    assert r.pcie_width == 8 and r.pcie_width_max == 16
    assert r.pcie_gen == 3 and r.pcie_gen_max == 5
    assert r.pcie_replay == 40


def test_nvlink_down_and_crc(pair: tuple[Device, SimDevice]) -> None:
    dev, sim = pair
    sim.nvlink_down(1, 5)
    sim.add_nvlink_errors(1, 7, crc_flit=12, crc_data=3, replay=2, recovery=1)
    links = dev.read_slow(1).nvlinks
    assert links[5].up is False and links[4].up is True
    assert (links[7].crc_flit, links[7].crc_data, links[7].replay, links[7].recovery) == (12, 3, 2, 1)


def test_gpu_fallen_off_the_bus(pair: tuple[Device, SimDevice]) -> None:
    dev, sim = pair
    sim.fall_off_bus(3)
    assert [(x.index, x.code) for x in dev.wait_xids(0.1)] == [(3, 79)]
    assert dev.read_fast(3).lost and dev.read_slow(3).lost
    assert dev.read_fast(3).lost  # and stays lost
    assert not dev.read_fast(2).lost and not dev.read_slow(2).lost


def test_unsupported_fields_are_none_not_errors(pair: tuple[Device, SimDevice]) -> None:
    dev, sim = pair
    sim.set_unsupported(0, "temp_hbm", "remap", "power")
    f = dev.read_fast(0)
    assert f.temp_hbm_c is None and f.power_w is None and f.temp_gpu_c is not None
    assert any(e.startswith("temp_hbm") for e in f.errors) and any(e.startswith("power") for e in f.errors)
    s = dev.read_slow(0)
    assert s.remap_pending is None and s.remap_failure is None and s.remap_correctable is None
    assert any(e.startswith("remap") for e in s.errors)
    assert s.ecc_sbe_aggregate is not None
    assert dev.read_fast(1).errors == ()


def test_bad_index_is_invalid_input(pair: tuple[Device, SimDevice]) -> None:
    dev, _ = pair
    with pytest.raises(InvalidInput, match="gpu index"):
        dev.read_fast(N)


def test_close_then_gpus_is_safe(pair: tuple[Device, SimDevice]) -> None:
    dev, _ = pair
    dev.close()
    dev.close()


def test_real_nvml_without_a_driver_is_data(caplog: pytest.LogCaptureFixture) -> None:
    """On this machine (no NVIDIA driver) the real library must say so, not crash. With a GPU, it must
    enumerate and read every GPU without raising."""
    from gpufleet.agent.devices.nvml import NvmlDevice

    dev: Any = NvmlDevice(clock=FakeClock())
    status = dev.open()
    if not status.ok:
        assert status.message.startswith("no NVIDIA driver on this node"), status.message
        assert dev.gpus() == ()
        assert dev.wait_xids(0.01) == []
        dev.close()
        assert "shutdown" not in caplog.text  # nothing was initialised, nothing to shut down
    else:
        for g in dev.gpus():
            dev.read_fast(g.index)
            dev.read_slow(g.index)
    dev.close()
