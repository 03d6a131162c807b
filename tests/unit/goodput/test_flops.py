"""MFU inputs: the analytic transformer formula against FLOPs counted from the example model."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from gpufleet.domain.errors import InvalidInput, NotFound
from gpufleet.goodput.flops import mfu, peak_flops, peak_table, transformer_flops_per_step
from tests.conftest import require_service

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny_gpt"


@pytest.mark.parametrize(("batch", "seq", "d", "layers", "heads", "vocab"),
                         [(4, 64, 64, 2, 4, 256), (2, 128, 96, 3, 6, 500), (1, 256, 128, 1, 8, 1000)])
def test_counted_flops_match_the_formula(batch: int, seq: int, d: int, layers: int, heads: int, vocab: int) -> None:
    require_service(importlib.util.find_spec("torch") is not None, "torch")
    import torch

    from gpufleet.goodput.torch_flops import counted_flops

    sys.path.insert(0, str(EXAMPLE))
    try:
        from model import TinyGPT, loss_of  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(EXAMPLE))
    model = TinyGPT(vocab, d, layers, heads, seq)
    idx = torch.randint(0, vocab, (batch, seq + 1))
    counted = counted_flops(lambda: loss_of(model, idx).backward())
    formula = transformer_flops_per_step(batch=batch, seq=seq, d_model=d, layers=layers, vocab=vocab)
    assert abs(counted - formula) <= 0.02 * formula, (counted, formula)


def test_forward_only_is_a_third() -> None:
    kw = {"batch": 8, "seq": 2048, "d_model": 4096, "layers": 32, "vocab": 32000}
    assert transformer_flops_per_step(**kw) == 3 * transformer_flops_per_step(**kw, backward=False)


def test_the_formula_matches_megatron_closed_form() -> None:
    b, t, d, n, v = 8, 2048, 4096, 32, 32000  # Narayanan et al. 2021: 72BTLd^2(1 + T/6d + V/12Ld)
    closed = 72 * b * t * n * d * d * (1 + t / (6 * d) + v / (12 * n * d))
    assert transformer_flops_per_step(batch=b, seq=t, d_model=d, layers=n, vocab=v) == pytest.approx(closed)


def test_peak_table_rows_are_sourced_and_looked_up() -> None:
    assert all(p.source and p.flops > 0 for p in peak_table())
    h100 = peak_flops("h100 sxm", "BF16")
    assert h100.sku == "H100 SXM" and "datasheet" in h100.source
    assert peak_flops("H100 SXM", "fp8").flops == pytest.approx(2 * h100.flops, rel=1e-3)  # FP8 doubles BF16 on Hopper
    with pytest.raises(NotFound):
        peak_flops("Z9000", "bf16")
    with pytest.raises(InvalidInput) as err:
        peak_flops("A100 SXM", "fp8")
    assert err.value.field == "dtype"


def test_mfu_checks_its_inputs() -> None:
    assert mfu(1e15, 2.0, 1e15) == pytest.approx(0.5)
    with pytest.raises(InvalidInput) as err:
        mfu(1e15, 0.0, 1e15)
    assert err.value.field == "step_seconds"
    with pytest.raises(InvalidInput) as err:
        transformer_flops_per_step(batch=0, seq=1, d_model=1, layers=1, vocab=1)
    assert err.value.field == "batch"
