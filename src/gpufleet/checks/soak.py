"""Soak: sustained GEMM on every GPU at once for a set time, in windows, while watching clocks,
throttle reasons, temperature and XIDs; then judge throughput stability and what the GPU reported.

Judgement (``judge_soak``, pure):

* ``soak_gemm`` - the median window throughput per GPU, judged against the node's best GPU;
* ``soak_stability`` - worst window / median, in %: warn below 90, fail below 80 (a GPU that
  starts fast and then throttles);
* ``soak_throttle`` - windows with a protective throttle reason (HW slowdown, thermal, power brake)
  per minute: fail at >= 0.6/min, GPUd's hw-slowdown threshold (leptonai/gpud hw-slowdown component);
* ``soak_xid`` - XIDs seen during the soak: any is a fatal failure.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpufleet.checks._torch import require_torch
from gpufleet.checks.judge import Measurement
from gpufleet.checks.model import CheckResult, Status
from gpufleet.checks.ops import random_pair
from gpufleet.checks.telemetry import Sample, Watcher
from gpufleet.domain.errors import InvalidInput

STABILITY_WARN_PCT = 90.0
STABILITY_FAIL_PCT = 80.0
# The CPU path runs on shared CI cores where another tenant can take a whole window: looser bars.
CPU_STABILITY_WARN_PCT = 50.0
CPU_STABILITY_FAIL_PCT = 20.0
THROTTLE_FAIL_PER_MIN = 0.6


@dataclass(frozen=True, slots=True)
class SoakWindow:
    gpu: int
    seconds: float
    tflops: float
    sample: Sample
    xids: tuple[int, ...] = ()


def run_soak(
    devices: Sequence[str],
    *,
    dtype: str,
    n: int,
    duration_s: float,
    window_s: float,
    watcher: Watcher,
    on_window: Callable[[float], None] | None = None,
) -> dict[int, list[SoakWindow]]:
    """Load every device in ``devices`` (index = GPU number) for ``duration_s``; CUDA devices run
    concurrently (one stream each, timed with CUDA events), CPU devices one after another."""
    torch = require_torch()
    if duration_s <= 0 or window_s <= 0:
        raise InvalidInput("soak duration", duration_s, "a positive duration and window")
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    bufs = []
    for dev in devices:
        a, b = random_pair(dev, n, seed=7)
        a, b = a.to(torch_dtype), b.to(torch_dtype)
        bufs.append((a, b, torch.empty(n, n, device=dev, dtype=torch_dtype)))
    flops = 2.0 * n**3
    cuda = devices[0].startswith("cuda")
    out: dict[int, list[SoakWindow]] = {i: [] for i in range(len(devices))}
    k = 1
    t_end = time.perf_counter() + duration_s
    while time.perf_counter() < t_end:
        per_dev: list[float] = []
        if cuda:
            # Interleave the launches (one GEMM per GPU in turn) so every GPU is busy at once: issuing
            # one GPU's whole window first would block on its launch queue while the others idle.
            starts = [torch.cuda.Event(enable_timing=True) for _ in devices]
            ends = [torch.cuda.Event(enable_timing=True) for _ in devices]
            for ev, dev in zip(starts, devices, strict=True):
                ev.record(torch.cuda.current_stream(dev))
            for _ in range(k):
                for a, b, c in bufs:
                    torch.matmul(a, b, out=c)
            for ev, dev in zip(ends, devices, strict=True):
                ev.record(torch.cuda.current_stream(dev))
            for dev in devices:
                torch.cuda.synchronize(dev)
            per_dev = [s.elapsed_time(e) / 1000.0 for s, e in zip(starts, ends, strict=True)]
        else:
            for a, b, c in bufs:
                t0 = time.perf_counter()
                for _ in range(k):
                    torch.matmul(a, b, out=c)
                per_dev.append(time.perf_counter() - t0)
        for gpu, secs in enumerate(per_dev):
            out[gpu].append(
                SoakWindow(
                    gpu=gpu,
                    seconds=secs,
                    tflops=k * flops / max(secs, 1e-9) / 1e12,
                    sample=watcher.sample(gpu),
                    xids=tuple(watcher.xids(gpu)),
                )
            )
        slowest = max(per_dev)
        k = max(1, round(k * window_s / max(slowest, 1e-6)))
        if on_window is not None:
            on_window(min(1.0, 1.0 - (t_end - time.perf_counter()) / duration_s))
    return out


def judge_soak(
    windows: Mapping[int, Sequence[SoakWindow]],
    *,
    warn_pct: float = STABILITY_WARN_PCT,
    fail_pct: float = STABILITY_FAIL_PCT,
) -> tuple[list[Measurement], list[CheckResult]]:
    """(measurements to judge against the node's best GPU, results judged here). ``warn_pct`` /
    ``fail_pct``: the stability bars (the CPU path passes looser ones: it shares cores with others)."""
    measurements: list[Measurement] = []
    results: list[CheckResult] = []
    for gpu in sorted(windows):
        ws = list(windows[gpu])
        if not ws:
            continue
        rates = [w.tflops for w in ws]
        median = statistics.median(rates)
        measurements.append(
            Measurement("soak_gemm", gpu, median, "TFLOPS", attrs=(("windows", str(len(ws))),))
        )
        stability = 100.0 * min(rates) / median if median > 0 else 0.0
        if stability < fail_pct:
            st, why = Status.FAIL, f"worst window {stability:.0f}% of the median (< {fail_pct:g}%)"
        elif stability < warn_pct:
            st, why = Status.WARN, f"worst window {stability:.0f}% of the median (< {warn_pct:g}%)"
        else:
            st, why = Status.PASS, ""
        results.append(
            CheckResult(
                "soak_stability",
                gpu,
                round(stability, 2),
                "%",
                100.0,
                st,
                round(stability / 100.0 - 1.0, 4),
                why,
            )
        )
        minutes = max(sum(w.seconds for w in ws) / 60.0, 1e-9)
        throttled = [w for w in ws if w.sample.throttle]
        rate = len(throttled) / minutes
        reasons = sorted({r for w in throttled for r in w.sample.throttle})
        temps = [w.sample.temperature_c for w in ws if w.sample.temperature_c is not None]
        clocks = [w.sample.sm_clock_mhz for w in ws if w.sample.sm_clock_mhz is not None]
        attrs = []
        if temps:
            attrs.append(("max_temperature_c", f"{max(temps):g}"))
        if clocks:
            attrs.append(("min_sm_clock_mhz", f"{min(clocks):g}"))
        if reasons:
            attrs.append(("throttle_reasons", ",".join(reasons)))
        bad = rate >= THROTTLE_FAIL_PER_MIN
        results.append(
            CheckResult(
                "soak_throttle",
                gpu,
                round(rate, 3),
                "events/min",
                0.0,
                Status.FAIL if bad else Status.PASS,
                None,
                f"protective throttling {rate:.2f}/min ({', '.join(reasons)})" if bad else "",
                attrs=tuple(attrs),
            )
        )
        xids = [x for w in ws for x in w.xids]
        results.append(
            CheckResult(
                "soak_xid",
                gpu,
                float(len(xids)),
                "xids",
                0.0,
                Status.FAIL if xids else Status.PASS,
                None,
                f"XIDs during soak: {sorted(set(xids))}" if xids else "",
                fatal=bool(xids),
            )
        )
    return measurements, results
