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


_CUDA = {
    Level.QUICK: Sizes(
        8192, 20, 5, 1 * GiB, 20, 256 * MiB, 10, 2048, 2, 256 * MiB, 20, 5, 0.0, 5.0, 8192, 4 * GiB, 2 * GiB
    ),
    Level.FULL: Sizes(
        8192, 100, 10, 4 * GiB, 50, 1 * GiB, 20, 2048, 5, 16 * GiB, 20, 5, 300.0, 10.0, 8192, 4 * GiB, 2 * GiB
    ),
    Level.MULTINODE: Sizes(
        8192, 20, 5, 1 * GiB, 20, 256 * MiB, 10, 2048, 2, 256 * MiB, 20, 5, 0.0, 5.0, 8192, 4 * GiB, 2 * GiB
    ),
}
_CPU = {
    Level.QUICK: Sizes(128, 5, 1, 4 * MiB, 5, 4 * MiB, 5, 64, 2, 1 * MiB, 5, 1, 0.0, 0.5, 128, MiB, MiB),
    Level.FULL: Sizes(
        256, 10, 2, 16 * MiB, 10, 16 * MiB, 10, 128, 3, 4 * MiB, 10, 2, 3.0, 0.5, 128, MiB, MiB
    ),
    Level.MULTINODE: Sizes(128, 5, 1, 4 * MiB, 5, 4 * MiB, 5, 64, 2, 1 * MiB, 9, 1, 0.0, 0.5, 128, MiB, MiB),
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
