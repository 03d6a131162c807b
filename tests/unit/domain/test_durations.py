"""``positive_seconds``: the one check of a loop's period (the goodput push, the tracker loop)."""

from __future__ import annotations

import pytest

from gpufleet.domain.durations import positive_seconds
from gpufleet.domain.errors import InvalidInput


@pytest.mark.parametrize(("text", "seconds"), [("30", 30.0), (1.5, 1.5), ("5m", 300.0), ("1h30m", 5400.0)])
def test_a_positive_period_is_seconds_or_a_duration(text: str | float, seconds: float) -> None:
    assert positive_seconds(text, "period") == seconds


@pytest.mark.parametrize("text", ["0", 0, "-5", -1.0, "nan", "inf", float("nan"), "soon", ""])
def test_a_period_that_would_spin_or_never_come_is_named(text: str | float) -> None:
    with pytest.raises(InvalidInput) as err:
        positive_seconds(text, "GPUFLEET_X_PERIOD")
    assert err.value.field == "GPUFLEET_X_PERIOD" and "seconds > 0" in err.value.expected
