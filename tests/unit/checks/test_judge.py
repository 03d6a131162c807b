from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.checks.baselines import Baseline, Baselines, Sku, load_baselines
from gpufleet.checks.judge import Measurement, judge_absolute, judge_node, judge_relative
from gpufleet.checks.model import Status
from gpufleet.domain.errors import InvalidInput

BAR = Baseline(sku="X", check="gemm_bf16", unit="TFLOPS", floor=75.0, expected=100.0, source="t")


@pytest.mark.parametrize(
    ("value", "status"),
    [
        (120.0, Status.PASS),
        (91.0, Status.PASS),
        (89.0, Status.WARN),
        (76.0, Status.WARN),
        (74.9, Status.FAIL),
    ],
)
def test_absolute_bands(value: float, status: Status) -> None:
    v = judge_absolute(value, BAR, warn_margin=0.10)
    assert v.status is status
    assert v.expected == 100.0
    assert v.margin == pytest.approx((value - 100.0) / 100.0)


def test_no_bar_passes_without_expectation() -> None:
    v = judge_absolute(1.0, None, 0.1)
    assert v.status is Status.PASS and v.expected is None and v.margin is None


def test_nan_is_rejected_with_a_clear_error() -> None:
    with pytest.raises(InvalidInput) as err:
        judge_absolute(math.nan, BAR, 0.1)
    assert err.value.field == "value"


def test_relative_flags_more_than_tolerance_below_best() -> None:
    assert judge_relative(89.0, 100.0, 0.10).status is Status.FAIL
    assert judge_relative(91.0, 100.0, 0.10).status is Status.PASS
    assert "11%" in judge_relative(89.0, 100.0, 0.10).reason


@given(
    a=st.floats(0, 2000, allow_nan=False),
    b=st.floats(0, 2000, allow_nan=False),
)
def test_a_higher_value_never_gets_a_worse_status(a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert judge_absolute(hi, BAR, 0.1).status.rank <= judge_absolute(lo, BAR, 0.1).status.rank


def _bars() -> Baselines:
    return Baselines(skus=(Sku("X", ("X",), 0.10),), entries=(BAR,))


def test_node_judgement_catches_a_slow_gpu_on_a_sku_without_bars() -> None:
    values = [700.0, 705.0, 698.0, 600.0, 702.0]  # gpu3 is 15 % below the best
    ms = [Measurement("gemm_fp16", g, v, "TFLOPS") for g, v in enumerate(values)]
    results = judge_node(ms, _bars(), "X")
    statuses = {r.gpu: r.status for r in results}
    assert statuses[3] is Status.FAIL
    assert all(statuses[g] is Status.PASS for g in (0, 1, 2, 4))
    slow = next(r for r in results if r.gpu == 3)
    assert "below the node's best" in slow.message
    assert dict(slow.attrs)["pct_of_node_best"] == f"{100 * 600 / 705:.1f}"


def test_node_judgement_takes_the_worse_of_absolute_and_relative() -> None:
    ms = [Measurement("gemm_bf16", 0, 80.0, "TFLOPS"), Measurement("gemm_bf16", 1, 82.0, "TFLOPS")]
    results = judge_node(ms, _bars(), "X")
    assert [r.status for r in results] == [Status.WARN, Status.WARN]  # close together, but below expected
    ms2 = [Measurement("gemm_bf16", 0, 130.0, "TFLOPS"), Measurement("gemm_bf16", 1, 95.0, "TFLOPS")]
    r2 = judge_node(ms2, _bars(), "X")
    assert r2[1].status is Status.FAIL and r2[1].expected == 100.0  # fine absolutely, 27 % below its peer


def test_node_wide_results_are_not_compared_relatively() -> None:
    ms = [Measurement("gemm_bf16", None, 90.5, "TFLOPS")]
    (r,) = judge_node(ms, _bars(), "X")
    assert r.status is Status.PASS and r.gpu is None


def test_percent_of_peak_and_unit_mismatch() -> None:
    b = load_baselines()
    (r,) = judge_node([Measurement("gemm_bf16", 0, 494.7, "TFLOPS")], b, "H100-SXM")
    assert r.status is Status.FAIL  # below the 547.5 floor
    assert dict(r.attrs)["pct_of_peak"] == "50.0"
    with pytest.raises(InvalidInput) as err:
        judge_node([Measurement("gemm_bf16", 0, 1.0, "GB/s")], b, "H100-SXM")
    assert "unit" in err.value.field
