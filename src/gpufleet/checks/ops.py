"""Measurement primitives on one device (CUDA GPU or CPU): GEMM, device copy, host<->device copy and
the silent-data-corruption computation. Each returns a raw number; judging happens in ``judge``.

Timing: warm-up iterations, then a synchronised wall-clock over ``iters`` iterations
(``torch.cuda.synchronize`` on CUDA), so launch overhead is amortised and asynchronous kernels are
counted in full.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpufleet.checks._torch import require_torch
from gpufleet.domain.errors import InvalidInput

GEMM_DTYPES = ("bf16", "fp16", "tf32", "fp8", "fp32")


def sync(device: str) -> None:
    torch = require_torch()
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: str, iters: int, warmup: int) -> float:
    """Seconds per call of ``fn`` on ``device``: ``warmup`` untimed calls, then ``iters`` calls split
    into up to three synchronised trials; the median trial counts, so one preempted trial on a busy
    host does not decide the result."""
    if iters < 1:
        raise InvalidInput("iters", iters, "at least 1")
    for _ in range(warmup):
        fn()
    sync(device)
    trials = min(3, iters)
    per_trial = max(1, iters // trials)
    times = []
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(per_trial):
            fn()
        sync(device)
        times.append((time.perf_counter() - t0) / per_trial)
    return statistics.median(times)


def gemm_supported(device: str, dtype: str) -> str | None:
    """None when ``dtype`` GEMM runs on ``device``; else why not."""
    torch = require_torch()
    if dtype not in GEMM_DTYPES:
        raise InvalidInput("--dtypes", dtype, f"one of {', '.join(GEMM_DTYPES)}")
    if device.startswith("cuda"):
        major, minor = torch.cuda.get_device_capability(device)
        if dtype == "fp8" and (major, minor) < (8, 9):
            return f"FP8 needs compute capability >= 8.9 (this GPU is {major}.{minor})"
        if dtype == "bf16" and major < 8:
            return f"BF16 tensor cores need compute capability >= 8.0 (this GPU is {major}.{minor})"
        if dtype == "tf32" and major < 8:
            return "TF32 needs compute capability >= 8.0"
        return None
    if dtype == "tf32":
        return "TF32 is a tensor-core format; the CPU path measures fp32 instead"
    if dtype == "fp8" and not hasattr(torch, "float8_e4m3fn"):
        return "this torch build has no float8_e4m3fn"
    return None


def random_pair(device: str, n: int, seed: int) -> tuple[Any, Any]:
    """Two seeded n x n float32 normal matrices generated on ``device`` itself (an 8192^2 randn on
    the host takes longer than the GEMM check)."""
    torch = require_torch()
    gen = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(n, n, generator=gen, device=device)
    b = torch.randn(n, n, generator=gen, device=device)
    return a, b


def _gemm_call(torch: Any, device: str, dtype: str, n: int) -> Callable[[], object]:
    a, b = random_pair(device, n, seed=1234)
    if dtype == "fp8":
        a = a.to(torch.float8_e4m3fn)
        b = b.to(torch.float8_e4m3fn).t()
        one = torch.tensor(1.0, device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    torch_dtype = {
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "tf32": torch.float32,
        "fp32": torch.float32,
    }[dtype]
    a, b = a.to(torch_dtype), b.to(torch_dtype)
    out = torch.empty(n, n, device=device, dtype=torch_dtype)
    return lambda: torch.matmul(a, b, out=out)


def gemm_tflops(device: str, dtype: str, n: int, iters: int, warmup: int) -> float:
    """Dense ``n``x``n``x``n`` GEMM throughput in TFLOPS (2*n^3 flops per call)."""
    torch = require_torch()
    tf32_before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        call = _gemm_call(torch, device, dtype, n)
        seconds = timed(call, device, iters, warmup)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32_before
    return 2.0 * n**3 / seconds / 1e12


def device_copy_gbps(device: str, nbytes: int, iters: int, warmup: int) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read + bytes written."""
    torch = require_torch()
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), device, iters, warmup)
    moved = 2.0 * int(src.numel()) * 4
    return moved / seconds / 1e9


def host_copy_gbps(device: str, nbytes: int, iters: int, warmup: int) -> tuple[float, float]:
    """(host->device, device->host) bandwidth in GB/s with a pinned host buffer (pinned only on CUDA)."""
    torch = require_torch()
    cuda = device.startswith("cuda")
    host = torch.ones(nbytes, dtype=torch.uint8, pin_memory=cuda)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    h2d = timed(lambda: dev.copy_(host, non_blocking=True), device, iters, warmup)
    d2h = timed(lambda: host.copy_(dev, non_blocking=True), device, iters, warmup)
    return nbytes / h2d / 1e9, nbytes / d2h / 1e9


@dataclass(frozen=True, slots=True)
class SdcRun:
    dtype: str
    digest: str  # sha256 of the result's bytes
    exact: bool  # Freivalds' check of the result against the exact integer product


def sdc_inputs(torch: Any, n: int, seed: int) -> tuple[Any, Any]:
    """Two n x n integer matrices with entries in {-1, 0, 1}: every partial sum of their product is an
    integer of magnitude <= n, exact in fp32/TF32 and (for n <= 2048) in fp16, whatever the summation
    order a GEMM kernel picks. So a healthy GPU must produce one bit pattern, the same everywhere."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    a = torch.randint(-1, 2, (n, n), generator=gen, dtype=torch.int64)
    b = torch.randint(-1, 2, (n, n), generator=gen, dtype=torch.int64)
    return a, b


def sdc_run(device: str, dtype: str, n: int, seed: int, *, flip_bit: int | None = None) -> SdcRun:
    """Compute A @ B on ``device`` in ``dtype`` ("fp32" (TF32 allowed on CUDA) or "fp16"), copy it
    back, hash its bytes and verify it exactly with Freivalds' algorithm (C r == A (B r) in int64).

    ``flip_bit`` (tests only) flips that bit of the first element of the result after it comes back,
    as a corrupted GPU would.
    """
    torch = require_torch()
    if dtype == "fp16" and n > 2048:
        raise InvalidInput("sdc n", n, "at most 2048 for fp16 (larger sums are not exact in fp16)")
    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16}.get(dtype)
    if torch_dtype is None:
        raise InvalidInput("sdc dtype", dtype, "fp32 or fp16")
    a, b = sdc_inputs(torch, n, seed)
    tf32_before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        c = torch.matmul(a.to(device=device, dtype=torch_dtype), b.to(device=device, dtype=torch_dtype))
        result = c.to(device="cpu", dtype=torch.float32).contiguous()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32_before
    if flip_bit is not None:
        bits = result.view(torch.int32)
        bits[0, 0] ^= 1 << flip_bit
    digest = hashlib.sha256(result.numpy().tobytes()).hexdigest()  # one copy (bytes(storage) walks it in Python)
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    # Entries never 0, so an error in any single element always changes C r.
    r = torch.randint(1, 1 << 16, (n, 1), generator=gen, dtype=torch.int64)
    as_int = result.to(torch.int64)
    exact = bool(torch.equal(result, as_int.to(torch.float32))) and bool(torch.equal(as_int @ r, a @ (b @ r)))
    return SdcRun(dtype=dtype, digest=digest, exact=exact)
