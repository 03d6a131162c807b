"""FLOPs of one training step counted from the model itself (``torch.utils.flop_counter``; torch lazily)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def counted_flops(step: Callable[[], Any]) -> int:
    """Run ``step`` (forward + backward of one batch, no optimizer needed) under ``FlopCounterMode`` and
    return the FLOPs it counted (matmuls, convolutions and attention; 2 FLOPs per multiply-add).

    Attention runs on the math kernel while counting: the counter knows the CUDA flash/efficient
    kernels but not the CPU flash kernel, whose FLOPs would silently go missing. The math kernel does
    the same T x T products, so the count is that of any dense attention."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        step()
    return int(counter.get_total_flops())
