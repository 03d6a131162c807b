from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.checks.fleet import FleetSample, Side, derive_baselines, distributions, outliers
from gpufleet.domain.errors import InvalidInput


def _fleet(values: list[float], sku: str = "H100-SXM", check: str = "gemm_bf16") -> list[FleetSample]:
    return [FleetSample(f"n{i // 8:03d}", i % 8, sku, check, v, "TFLOPS") for i, v in enumerate(values)]


def test_a_slow_gpu_stands_out_of_its_sku() -> None:
    values = [730.0 + (i % 7) - 3 for i in range(64)]
    values[37] = 610.0
    found = outliers(_fleet(values))
    assert [(o.sample.node, o.sample.gpu) for o in found] == [("n004", 5)]
    assert found[0].z < -3.5


def test_groups_are_per_sku_and_check() -> None:
    h100 = _fleet([730.0 + (i % 5) for i in range(20)])
    b200 = _fleet([1660.0 + (i % 5) for i in range(20)], sku="B200")
    hbm = _fleet([2700.0 + (i % 5) for i in range(20)], check="hbm_copy")
    # One SKU's normal values are not outliers next to another SKU's.
    assert outliers(h100 + b200 + hbm) == []
    dists = {(d.sku, d.check): d for d in distributions(h100 + b200 + hbm)}
    assert dists[("B200", "gemm_bf16")].median == 1662.0
    assert dists[("H100-SXM", "gemm_bf16")].n == 20


def test_mad_zero_falls_back_to_mean_absolute_deviation() -> None:
    values = [730.0] * 30 + [650.0]
    found = outliers(_fleet(values))
    assert len(found) == 1 and found[0].sample.value == 650.0


def test_side_selects_direction_and_min_rel_ignores_noise() -> None:
    values = [100.0 + 0.01 * (i % 3) for i in range(30)] + [140.0]
    assert outliers(_fleet(values), side=Side.LOW) == []
    assert [o.sample.value for o in outliers(_fleet(values), side=Side.HIGH)] == [140.0]
    tight = [100.0 + 0.01 * (i % 3) for i in range(30)] + [100.5]
    assert outliers(_fleet(tight), side=Side.BOTH) == []  # 0.5 % off: beyond z, within min_rel


def test_small_groups_are_not_judged_and_bad_params_are_clear() -> None:
    assert outliers(_fleet([100.0, 100.0, 100.0, 10.0])) == []
    with pytest.raises(InvalidInput) as err:
        outliers([], threshold=0)
    assert err.value.field == "threshold"
    with pytest.raises(InvalidInput):
        outliers([], min_samples=2)


def test_derived_baselines_sit_below_the_median() -> None:
    values = [730.0 + (i % 9) - 4 for i in range(45)]
    (b,) = derive_baselines(_fleet(values))
    assert b.expected == 730.0
    assert 700.0 < b.floor < 730.0
    assert "45 fleet results" in b.source


@given(
    base=st.floats(10, 5000),
    spread=st.floats(0.001, 0.02),
    n=st.integers(10, 80),
    drop=st.floats(0.15, 0.9),
)
def test_a_gpu_far_below_a_tight_fleet_is_always_flagged(
    base: float, spread: float, n: int, drop: float
) -> None:
    values = [base * (1 + spread * ((i % 5) - 2) / 2) for i in range(n)]
    values.append(base * (1 - drop))
    found = outliers(_fleet(values))
    assert [o.sample.value for o in found] == [values[-1]]
