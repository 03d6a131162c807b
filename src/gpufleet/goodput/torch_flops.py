"""FLOPs of one training step counted from the model itself (``torch.utils.flop_counter``; torch lazily)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def counted_flops(step: Callable[[], Any]) -> int:
    """Run ``step`` (forward + backward of one batch, no optimizer needed) under ``FlopCounterMode`` and
    return the FLOPs it counted (matmuls, convolutions and attention kernels; 2 FLOPs per multiply-add)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step()
    return int(counter.get_total_flops())
