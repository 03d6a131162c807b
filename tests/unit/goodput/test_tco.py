"""The price of a useful GPU-hour, by hand."""

from __future__ import annotations

import math

import pytest

from gpufleet.domain.errors import InvalidInput
from gpufleet.goodput.tco import tco


def test_hand_computed_costs() -> None:
    t = tco(2.0, 8, 3600.0, 0.5, 0.4)  # 8 GPU-hours at 2 = 16; half of it trained, at 40 % of peak
    assert t.gpu_hours == 8 and t.cost == 16 and t.badput_cost == 8
    assert t.per_productive_gpu_hour == 4.0 and t.per_useful_gpu_hour == pytest.approx(10.0)
    assert tco(2.0, 8, 3600.0, 1.0).per_useful_gpu_hour is None  # no MFU, no useful-hour price
    nothing = tco(2.0, 8, 3600.0, 0.0, 0.4)
    assert math.isinf(nothing.per_productive_gpu_hour) and nothing.as_dict()["per_useful_gpu_hour"] is None


@pytest.mark.parametrize(("args", "field"), [((0.0, 8, 1.0, 0.5), "price_per_gpu_hour"),
                                             ((float("nan"), 8, 1.0, 0.5), "price_per_gpu_hour"),
                                             ((1.0, 0, 1.0, 0.5), "gpus"), ((1.0, 8, 1.0, 1.5), "ettr")])
def test_bad_input_names_the_field(args: tuple[float, int, float, float], field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        tco(*args)
    assert err.value.field == field
    with pytest.raises(InvalidInput) as err:
        tco(1.0, 8, 1.0, 0.5, 0.0)
    assert err.value.field == "mfu"
