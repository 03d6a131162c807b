"""How big and how long each check runs, per level and device. Pure.

CUDA sizes follow the published bars they are judged against (an all-reduce bar applies only at the
message size it was measured at); CPU sizes are tiny, so CI runs the same code in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpufleet.checks.model import Level
from gpufleet.domain.errors import InvalidInput

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class Sizes:
    gemm_n: int
    gemm_iters: int
    gemm_warmup: int
    copy_bytes: int  # HBM device-to-device copy
    copy_iters: int
    pcie_bytes: int
    pcie_iters: int
    sdc_n: int
    sdc_repeats: int
    nccl_bytes: int
    nccl_iters: int
    nccl_warmup: int
    soak_s: float  # 0 = no soak
    soak_window_s: float
    soak_n: int
    multinode_bytes: int
    pair_bytes: int


_CUDA_QUICK = Sizes(
    gemm_n=8192,
    gemm_iters=21,
    gemm_warmup=5,  # gpu-fryer's 8192^2 GEMM
    copy_bytes=1 * GiB,
    copy_iters=21,
    pcie_bytes=256 * MiB,
    pcie_iters=12,
    sdc_n=2048,
    sdc_repeats=2,  # 2048: the largest size whose fp16 sums stay exact
    nccl_bytes=256 * MiB,
    nccl_iters=21,
    nccl_warmup=5,  # NVSentinel's 256 MB loopback bar
    soak_s=0.0,
    soak_window_s=5.0,
    soak_n=8192,
    multinode_bytes=4 * GiB,
    pair_bytes=2 * GiB,  # NVSentinel 4 GB; cluster-health-scanner 2-8 GB
)
_CUDA = {
    Level.QUICK: _CUDA_QUICK,
    Level.FULL: replace(
        _CUDA_QUICK,
        gemm_iters=99,
        gemm_warmup=10,
        copy_bytes=4 * GiB,
        copy_iters=51,
        pcie_bytes=1 * GiB,
        pcie_iters=21,
        sdc_repeats=5,
        nccl_bytes=16 * GiB,  # Azure's 16G single-node bar
        soak_s=300.0,
        soak_window_s=10.0,
    ),
    Level.MULTINODE: _CUDA_QUICK,
}
_CPU_QUICK = Sizes(
    gemm_n=128,
    gemm_iters=9,
    gemm_warmup=2,
    copy_bytes=4 * MiB,
    copy_iters=9,
    pcie_bytes=4 * MiB,
    pcie_iters=9,
    sdc_n=64,
    sdc_repeats=2,
    nccl_bytes=1 * MiB,
    nccl_iters=9,
    nccl_warmup=1,
    soak_s=0.0,
    soak_window_s=0.5,
    soak_n=128,
    multinode_bytes=1 * MiB,
    pair_bytes=1 * MiB,
)
_CPU = {
    Level.QUICK: _CPU_QUICK,
    Level.FULL: replace(
        _CPU_QUICK,
        gemm_n=256,
        gemm_iters=15,
        gemm_warmup=3,
        copy_bytes=16 * MiB,
        copy_iters=15,
        pcie_bytes=16 * MiB,
        pcie_iters=15,
        sdc_n=128,
        sdc_repeats=3,
        nccl_bytes=4 * MiB,
        nccl_iters=15,
        nccl_warmup=2,
        soak_s=3.0,
    ),
    Level.MULTINODE: _CPU_QUICK,
}
_CUDA[Level.BURNIN] = replace(_CUDA[Level.FULL], soak_s=3600.0, soak_window_s=30.0)
_CPU[Level.BURNIN] = replace(_CPU[Level.FULL], soak_s=10.0, soak_window_s=1.0)


def sizes_for(level: Level, cuda: bool, soak_s: float | None = None) -> Sizes:
    """The sizes for ``level``; ``soak_s`` overrides the soak length (burn-in: hours)."""
    sizes = (_CUDA if cuda else _CPU)[level]
    if soak_s is not None:
        if soak_s < 0:
            raise InvalidInput("--soak", soak_s, "a non-negative duration")
        sizes = replace(sizes, soak_s=soak_s)
    return sizes
