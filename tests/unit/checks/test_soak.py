from __future__ import annotations

from gpufleet.checks.model import Status
from gpufleet.checks.soak import SoakWindow, judge_soak, run_soak
from gpufleet.checks.telemetry import NullWatcher, Sample, throttle_names


def _w(
    gpu: int,
    tflops: float,
    throttle: tuple[str, ...] = (),
    xids: tuple[int, ...] = (),
    temp: float | None = 60.0,
) -> SoakWindow:
    return SoakWindow(gpu=gpu, seconds=6.0, tflops=tflops, sample=Sample(1980.0, temp, throttle), xids=xids)


def test_steady_gpu_passes() -> None:
    meas, results = judge_soak({0: [_w(0, 700.0), _w(0, 702.0), _w(0, 698.0)]})
    assert meas[0].check == "soak_gemm" and meas[0].value == 700.0
    assert all(r.status is Status.PASS for r in results)
    throttle = next(r for r in results if r.check == "soak_throttle")
    assert dict(throttle.attrs)["max_temperature_c"] == "60"


def test_throttling_xids_and_sagging_throughput_fail() -> None:
    windows = [
        _w(0, 700.0),
        _w(0, 690.0, ("hw_thermal_slowdown",), temp=92.0),
        _w(0, 520.0, ("hw_slowdown",)),
        _w(0, 700.0, xids=(79,)),
    ]
    _, results = judge_soak({0: windows})
    by = {r.check: r for r in results}
    assert by["soak_stability"].status is Status.FAIL  # 520 / 695 = 75 %
    assert by["soak_throttle"].status is Status.FAIL and by["soak_throttle"].value == 5.0  # 2 per 24 s
    assert "hw_slowdown" in dict(by["soak_throttle"].attrs)["throttle_reasons"]
    assert by["soak_xid"].status is Status.FAIL and by["soak_xid"].fatal and "79" in by["soak_xid"].message


def test_mild_sag_warns() -> None:
    _, results = judge_soak({0: [_w(0, 700.0), _w(0, 700.0), _w(0, 600.0)]})
    assert next(r for r in results if r.check == "soak_stability").status is Status.WARN


def test_nvml_throttle_bits() -> None:
    assert throttle_names(0x8 | 0x40 | 0x1) == ("hw_slowdown", "hw_thermal_slowdown")  # 0x1 = idle, harmless
    assert throttle_names(0x4) == ()  # the ordinary software power cap is not protective throttling


def test_real_cpu_soak_produces_windows_for_every_device() -> None:
    windows = run_soak(
        ["cpu", "cpu"], dtype="fp32", n=64, duration_s=0.3, window_s=0.05, watcher=NullWatcher()
    )
    assert set(windows) == {0, 1}
    assert all(len(ws) >= 1 and all(w.tflops > 0 for w in ws) for ws in windows.values())


def test_stability_bars_are_parameters() -> None:
    windows = {0: [_w(0, 700.0), _w(0, 700.0), _w(0, 300.0)]}  # 43 %
    _, strict = judge_soak(windows)
    _, loose = judge_soak(windows, warn_pct=50.0, fail_pct=20.0)
    assert next(r for r in strict if r.check == "soak_stability").status is Status.FAIL
    assert next(r for r in loose if r.check == "soak_stability").status is Status.WARN


class FakeNvml:
    """The slice of the pynvml API the watcher uses, with scripted answers."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    nvmlEventTypeXidCriticalError = 8  # noqa: N815 (pynvml's name)

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        self.pending_xids: dict[int, list[int]] = {0: [], 1: [79, 94]}
        self.freed = 0
        self.shut = False

    def nvmlInit(self) -> None:
        return None

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlEventSetCreate(self) -> list[int]:
        return []

    def nvmlDeviceRegisterEvents(self, handle: int, kind: int, es: list[int]) -> None:
        es.append(handle)

    def nvmlEventSetWait_v2(self, es: list[int], timeout_ms: int) -> object:
        queue = self.pending_xids[es[0]]
        if not queue:
            raise self.NVMLError("timeout")
        return type("Data", (), {"eventData": queue.pop(0)})()

    def nvmlEventSetFree(self, es: list[int]) -> None:
        self.freed += 1

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return 1980 if h == 0 else 1410

    def nvmlDeviceGetTemperature(self, h: int, kind: int) -> int:
        return 61 if h == 0 else 88

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return 0x1 if h == 0 else 0x8 | 0x40


def test_nvml_watcher_reads_telemetry_and_drains_xids() -> None:
    from gpufleet.checks.telemetry import NvmlWatcher

    fake = FakeNvml()
    w = NvmlWatcher(2, nvml=fake)
    assert w.sample(0) == Sample(1980.0, 61.0, ())
    assert w.sample(1) == Sample(1410.0, 88.0, ("hw_slowdown", "hw_thermal_slowdown"))
    assert w.xids(1) == [79, 94]
    assert w.xids(1) == []  # drained
    assert w.xids(0) == []
    w.close()
    assert fake.freed == 2 and fake.shut
