"""The one door to PyTorch: imported lazily so the rest of gpufleet works without it."""

from __future__ import annotations

from types import ModuleType

from gpufleet.domain.errors import ExternalError

TORCH_PIN = "torch==2.13.0"


def require_torch() -> ModuleType:
    """``torch``, or a clear error saying how to install it (gpufleet does not depend on torch)."""
    try:
        import torch
    except ImportError as err:
        raise ExternalError(
            "torch",
            f"PyTorch is needed for `gpufleet check` but is not installed: install {TORCH_PIN} "
            f"(pip install {TORCH_PIN}; CUDA wheels from https://download.pytorch.org/whl/)",
            retryable=False,
        ) from err
    return torch
