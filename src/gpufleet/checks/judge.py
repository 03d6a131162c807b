"""Thresholds: turn raw measurements into judged :class:`CheckResult`s. Pure: no torch, no I/O.

Two judgements, and a result takes the worse of them:

* **absolute** against the SKU's bar (``baselines.toml``): below ``floor`` fails, below
  ``expected * (1 - warn_margin)`` warns;
* **relative** to the best GPU of the same node (gpu-fryer's rule): more than the SKU's
  ``relative_tolerance`` (10 % by default) below the best fails. This catches a slow GPU on a SKU with
  no bar, or a whole fleet whose bar is stale.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpufleet.checks.baselines import Baseline, Baselines
from gpufleet.checks.model import CheckResult, Status, worst_status
from gpufleet.domain.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class Measurement:
    """A raw, unjudged number from a check. Higher is better for every measured quantity."""

    check: str
    gpu: int | None
    value: float
    unit: str
    message_bytes: int | None = None  # all-reduce: the message size, to pick the matching bar
    attrs: tuple[tuple[str, str], ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Verdict:
    status: Status
    expected: float | None
    margin: float | None
    reason: str


def judge_absolute(value: float, bar: Baseline | None, warn_margin: float) -> Verdict:
    """``value`` against ``bar``; PASS with no expectation when there is no bar."""
    if math.isnan(value):  # the measurement itself broke
        raise InvalidInput("value", value, "a number (the measurement returned NaN)")
    if bar is None:
        return Verdict(Status.PASS, None, None, "no per-SKU bar")
    margin = (value - bar.expected) / bar.expected if bar.expected > 0 else None
    if value < bar.floor:
        return Verdict(Status.FAIL, bar.expected, margin, f"below the floor {bar.floor:g} {bar.unit}")
    warn_at = bar.expected * (1.0 - warn_margin)
    if value < warn_at and warn_at > bar.floor:
        return Verdict(
            Status.WARN,
            bar.expected,
            margin,
            f"more than {warn_margin:.0%} below the expected {bar.expected:g} {bar.unit}",
        )
    return Verdict(Status.PASS, bar.expected, margin, "")


def judge_relative(value: float, best: float, tolerance: float) -> Verdict:
    """``value`` against the best GPU of its node: FAIL when more than ``tolerance`` below it."""
    if best <= 0:
        return Verdict(Status.PASS, None, None, "")
    shortfall = (best - value) / best
    if shortfall > tolerance:
        return Verdict(
            Status.FAIL,
            None,
            None,
            f"{shortfall:.0%} below the node's best GPU ({best:.4g}); tolerance {tolerance:.0%}",
        )
    return Verdict(Status.PASS, None, None, "")


def judge_node(measurements: Iterable[Measurement], baselines: Baselines, sku: str) -> list[CheckResult]:
    """Judge every measurement of one node, absolutely and (per-GPU checks) against the node's best."""
    items = list(measurements)
    best: dict[str, float] = {}
    count: dict[str, int] = {}
    for m in items:
        if m.gpu is not None:
            best[m.check] = max(best.get(m.check, m.value), m.value)
            count[m.check] = count.get(m.check, 0) + 1
    tolerance = baselines.tolerance(sku)
    out: list[CheckResult] = []
    for m in items:
        bar = baselines.lookup(sku, m.check, m.message_bytes)
        if bar is not None and bar.unit != m.unit:
            raise InvalidInput(f"baseline[{sku}/{m.check}].unit", bar.unit, f"{m.unit!r} (the unit measured)")
        absolute = judge_absolute(m.value, bar, baselines.warn_margin)
        verdicts = [absolute]
        if m.gpu is not None and count.get(m.check, 0) > 1:
            verdicts.append(judge_relative(m.value, best[m.check], tolerance))
        status = worst_status([v.status for v in verdicts])
        reasons = [v.reason for v in verdicts if v.status is not Status.PASS and v.reason]
        attrs = dict(m.attrs)
        if bar is not None and bar.peak:
            attrs["pct_of_peak"] = f"{100.0 * m.value / bar.peak:.1f}"
        if m.gpu is not None and count.get(m.check, 0) > 1 and best[m.check] > 0:
            attrs["pct_of_node_best"] = f"{100.0 * m.value / best[m.check]:.1f}"
        if m.message_bytes is not None:
            attrs["message_bytes"] = str(m.message_bytes)
        out.append(
            CheckResult(
                check=m.check,
                gpu=m.gpu,
                value=m.value,
                unit=m.unit,
                expected=absolute.expected,
                status=status,
                margin=None if absolute.margin is None else round(absolute.margin, 4),
                message="; ".join(reasons),
                attrs=tuple(sorted(attrs.items())),
            )
        )
    return out
