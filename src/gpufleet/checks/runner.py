"""Run one level of the suite on this node and return a judged :class:`Report`.

Order: per GPU, GEMM per dtype, HBM copy, PCIe both ways and the SDC computation; then the node's
all-reduce (one process per GPU) and, when the level has one, the soak. Every per-GPU number is judged
against the SKU's bar and the node's best GPU (``judge.judge_node``). A check that raises on a GPU
becomes a failed result for that GPU (external failures are data); the run goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.checks import collective, ops, soak
from gpufleet.checks._torch import require_torch
from gpufleet.checks.baselines import CPU_SKU, Baselines
from gpufleet.checks.judge import Measurement, judge_node
from gpufleet.checks.model import CheckResult, Level, Report, Status
from gpufleet.checks.profile import Sizes, sizes_for
from gpufleet.checks.sdc import SdcObservation, judge_sdc
from gpufleet.checks.telemetry import watcher_for
from gpufleet.domain.errors import InvalidInput

log = logging.getLogger(__name__)

CUDA_GEMM = ("bf16", "fp16", "tf32", "fp8")
CPU_GEMM = ("bf16", "fp16", "tf32", "fp8", "fp32")  # tf32 is reported as skipped on a CPU
SDC_SEED = 20261121

Progress = Callable[[str, int, int], None]  # (label, steps done, steps total)


@dataclass(frozen=True, slots=True)
class CheckOptions:
    level: Level
    device: str = "auto"  # auto | cuda | cpu
    cpu_devices: int = 2  # logical "GPUs" on the CPU path
    soak_s: float | None = None  # override the level's soak length
    dtypes: tuple[str, ...] | None = None  # restrict the GEMM dtypes
    inject_sdc_flip: tuple[int, int] | None = None  # tests only: (gpu, run) whose result gets a bit flip


@dataclass(frozen=True, slots=True)
class Target:
    cuda: bool
    devices: tuple[str, ...]
    device_name: str


def resolve_target(device: str, cpu_devices: int) -> Target:
    """Which devices to check: ``auto`` picks CUDA when torch sees a GPU."""
    torch = require_torch()
    if device not in ("auto", "cuda", "cpu"):
        raise InvalidInput("--device", device, "auto, cuda or cpu")
    has_cuda = bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    if device == "cuda" and not has_cuda:
        raise InvalidInput("--device", device, "a machine where torch sees a CUDA GPU (use --device cpu)")
    if device == "cuda" or (device == "auto" and has_cuda):
        count = torch.cuda.device_count()
        names = {torch.cuda.get_device_name(i) for i in range(count)}
        if len(names) > 1:
            log.warning("mixed GPU models on one node: %s; judging all as %s", sorted(names), min(names))
        return Target(True, tuple(f"cuda:{i}" for i in range(count)), min(names))
    if cpu_devices < 1:
        raise InvalidInput("--cpu-devices", cpu_devices, "at least 1")
    # One intra-op thread per logical device: on a shared CI box, multi-threaded kernels spin against
    # other tenants and swing by 100x; one thread gives repeatable numbers.
    torch.set_num_threads(1)
    return Target(False, ("cpu",) * cpu_devices, "cpu")


class _Steps:
    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total, self.done, self.progress = total, 0, progress

    def step(self, label: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(label, self.done, self.total)


def _failed(check: str, gpu: int | None, unit: str, err: Exception) -> CheckResult:
    log.error("%s on gpu %s raised %s: %s", check, gpu, type(err).__name__, err)
    return CheckResult(check, gpu, 0.0, unit, None, Status.FAIL, None, f"error: {type(err).__name__}: {err}")


def run_node_checks(
    opts: CheckOptions, baselines: Baselines, node: str, progress: Progress | None = None
) -> Report:
    """Run ``opts.level`` (quick, full or burnin) on this node."""
    if opts.level is Level.MULTINODE:
        raise InvalidInput(
            "--level", str(opts.level), "quick, full or burnin (multinode runs under a launcher)"
        )
    t0 = time.perf_counter()
    target = resolve_target(opts.device, opts.cpu_devices)
    sizes = sizes_for(opts.level, target.cuda, opts.soak_s)
    sku = baselines.sku_for_device(target.device_name) if target.cuda else CPU_SKU
    wanted = opts.dtypes or (CUDA_GEMM if target.cuda else CPU_GEMM)
    skipped: list[str] = []
    dtypes = []
    for dt in wanted:
        why = ops.gemm_supported(target.devices[0], dt)
        if why is None:
            dtypes.append(dt)
        else:
            skipped.append(f"gemm_{dt}: {why}")
    n_dev = len(target.devices)
    collective_runs = n_dev >= 2
    if not collective_runs:
        skipped.append("nccl_allreduce: needs at least 2 GPUs on the node")
    total = n_dev * (len(dtypes) + 3) + int(collective_runs) + int(sizes.soak_s > 0)
    steps = _Steps(total, progress)
    measurements: list[Measurement] = []
    extra: list[CheckResult] = []
    sdc_obs: dict[int, list[SdcObservation]] = {}
    for gpu, dev in enumerate(target.devices):
        _per_gpu(gpu, dev, dtypes, sizes, opts, steps, measurements, extra, sdc_obs)
    extra += judge_sdc(sdc_obs)
    if collective_runs:
        try:
            bw = collective.node_allreduce(
                n_dev, target.cuda, sizes.nccl_bytes, sizes.nccl_iters, sizes.nccl_warmup
            )
            measurements.append(
                Measurement(
                    "nccl_allreduce",
                    None,
                    bw,
                    "GB/s",
                    message_bytes=sizes.nccl_bytes,
                    attrs=(("ranks", str(n_dev)),),
                )
            )
        except Exception as err:
            extra.append(_failed("nccl_allreduce", None, "GB/s", err))
        steps.step("nccl all-reduce")
    if sizes.soak_s > 0:
        dtype = "bf16" if target.cuda else "fp32"
        watcher = watcher_for(target.cuda, n_dev)
        try:
            windows = soak.run_soak(
                target.devices,
                dtype=dtype,
                n=sizes.soak_n,
                duration_s=sizes.soak_s,
                window_s=sizes.soak_window_s,
                watcher=watcher,
            )
        finally:
            watcher.close()
        if target.cuda:
            soak_m, soak_r = soak.judge_soak(windows)
        else:
            soak_m, soak_r = soak.judge_soak(
                windows, warn_pct=soak.CPU_STABILITY_WARN_PCT, fail_pct=soak.CPU_STABILITY_FAIL_PCT
            )
        measurements += soak_m
        extra += soak_r
        steps.step("soak")
    results = judge_node(measurements, baselines, sku) + extra
    order = {name: i for i, name in enumerate(_ORDER)}
    results.sort(key=lambda r: (order.get(r.check, len(order)), r.check, -1 if r.gpu is None else r.gpu))
    return Report(
        node=node,
        level=opts.level,
        device="cuda" if target.cuda else "cpu",
        sku=sku,
        gpus=n_dev,
        results=tuple(results),
        skipped=tuple(skipped),
        wall_s=time.perf_counter() - t0,
    )


_ORDER = (
    "gemm_bf16",
    "gemm_fp16",
    "gemm_tf32",
    "gemm_fp8",
    "gemm_fp32",
    "hbm_copy",
    "pcie_h2d",
    "pcie_d2h",
    "sdc",
    "nccl_allreduce",
    "soak_gemm",
    "soak_stability",
    "soak_throttle",
    "soak_xid",
)


def _per_gpu(
    gpu: int,
    dev: str,
    dtypes: list[str],
    sizes: Sizes,
    opts: CheckOptions,
    steps: _Steps,
    measurements: list[Measurement],
    extra: list[CheckResult],
    sdc_obs: dict[int, list[SdcObservation]],
) -> None:
    for dt in dtypes:
        try:
            tf = ops.gemm_tflops(dev, dt, sizes.gemm_n, sizes.gemm_iters, sizes.gemm_warmup)
            measurements.append(
                Measurement(f"gemm_{dt}", gpu, tf, "TFLOPS", attrs=(("n", str(sizes.gemm_n)),))
            )
        except Exception as err:
            extra.append(_failed(f"gemm_{dt}", gpu, "TFLOPS", err))
        steps.step(f"gpu{gpu} gemm {dt}")
    try:
        bw = ops.device_copy_gbps(dev, sizes.copy_bytes, sizes.copy_iters, 2)
        measurements.append(
            Measurement("hbm_copy", gpu, bw, "GB/s", attrs=(("bytes", str(sizes.copy_bytes)),))
        )
    except Exception as err:
        extra.append(_failed("hbm_copy", gpu, "GB/s", err))
    steps.step(f"gpu{gpu} hbm copy")
    try:
        h2d, d2h = ops.host_copy_gbps(dev, sizes.pcie_bytes, sizes.pcie_iters, 2)
        attrs = (("bytes", str(sizes.pcie_bytes)),)
        measurements.append(Measurement("pcie_h2d", gpu, h2d, "GB/s", attrs=attrs))
        measurements.append(Measurement("pcie_d2h", gpu, d2h, "GB/s", attrs=attrs))
    except Exception as err:
        extra.append(_failed("pcie_h2d", gpu, "GB/s", err))
    steps.step(f"gpu{gpu} pcie")
    obs: list[SdcObservation] = []
    try:
        for run in range(sizes.sdc_repeats):
            flip = 7 if opts.inject_sdc_flip == (gpu, run) else None
            for dt in ("fp32", "fp16"):
                r = ops.sdc_run(dev, dt, sizes.sdc_n, SDC_SEED, flip_bit=flip if dt == "fp32" else None)
                obs.append(SdcObservation(dtype=dt, run=run, digest=r.digest, exact=r.exact))
        sdc_obs[gpu] = obs
    except Exception as err:
        extra.append(_failed("sdc", gpu, "mismatches", err))
    steps.step(f"gpu{gpu} sdc")
