"""Model FLOPs per step and peak FLOP/s per GPU (pure): the inputs of MFU.

**The analytic transformer formula** (Narayanan et al., "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM", SC'21, eq. 3 without activation recomputation). A decoder-only model
with ``L`` layers, width ``d``, a ``4d`` MLP, vocabulary ``V``, trained on ``B`` sequences of ``T``
tokens does per step (forward + backward = 3x forward; multiply-add = 2 FLOPs)::

    per layer, forward:  24·B·T·d²   (QKV 6, output projection 2, MLP 16)
                        + 4·B·T²·d   (scores Q·Kᵀ and the weighted sum, full TxT as dense kernels do)
    LM head, forward:     2·B·T·d·V
    step:                 3 x (L x layer + head) = 72·B·T·L·d² · (1 + T/(6d) + V/(12·L·d))

Embeddings, norms, softmax and elementwise work are left out (they are not matmuls; under 1 % at any
size that matters). ``ffn`` other than ``4d`` replaces the MLP term 16·d² with 4·d·ffn.
``gpufleet.goodput.torch_flops.counted_flops`` counts the same thing from the model itself.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from importlib import resources

from gpufleet.domain.errors import InvalidInput, NotFound


def transformer_flops_per_step(*, batch: int, seq: int, d_model: int, layers: int, vocab: int,
                               ffn: int | None = None, backward: bool = True) -> float:
    """Training FLOPs of one step on one model replica (see the module docstring)."""
    for name, v in (("batch", batch), ("seq", seq), ("d_model", d_model), ("layers", layers), ("vocab", vocab)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidInput(name, v, "a positive integer")
    f = 4 * d_model if ffn is None else ffn
    if f < 1:
        raise InvalidInput("ffn", ffn, "a positive integer")
    tokens = batch * seq
    layer = 2 * tokens * (4 * d_model * d_model + 2 * d_model * f) + 4 * batch * seq * seq * d_model
    head = 2 * tokens * d_model * vocab
    return float((3 if backward else 1) * (layers * layer + head))


@dataclass(frozen=True, slots=True)
class PeakFlops:
    sku: str
    dtype: str
    flops: float  # dense, per GPU, FLOP/s
    source: str


@cache
def peak_table() -> tuple[PeakFlops, ...]:
    """The shipped table ``goodput/data/peak_flops.csv`` (dense tensor-core peaks from vendor datasheets)."""
    text = resources.files("gpufleet.goodput").joinpath("data/peak_flops.csv").read_text("utf-8")
    rows = csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))
    return tuple(PeakFlops(r["sku"], r["dtype"], float(r["dense_tflops"]) * 1e12, r["source"]) for r in rows)


def peak_flops(sku: str, dtype: str) -> PeakFlops:
    """The dense peak of ``sku`` (as in the table, case-insensitive) at ``dtype`` (bf16, fp16, tf32, fp8, fp64)."""
    rows = [p for p in peak_table() if p.sku.lower() == sku.lower()]
    if not rows:
        raise NotFound("GPU SKU in the peak FLOP/s table", sku)
    for p in rows:
        if p.dtype == dtype.lower():
            return p
    raise InvalidInput("dtype", dtype, f"one of {sorted(p.dtype for p in rows)} for {rows[0].sku}")


def mfu(flops_per_step: float, step_seconds: float, peak: float) -> float:
    """Model FLOPs utilisation of one step: achieved FLOP/s over the peak."""
    if step_seconds <= 0:
        raise InvalidInput("step_seconds", step_seconds, "a duration > 0")
    if peak <= 0:
        raise InvalidInput("peak", peak, "a peak FLOP/s > 0")
    return flops_per_step / step_seconds / peak
