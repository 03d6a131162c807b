"""Fleet-relative judgement: a per-SKU distribution of check results and robust outliers in it.

Pure (no torch, no I/O); the controller calls it with the check results it has stored. A hand-written
bar goes stale and differs between fleets (driver, cooling, power caps); the fleet's own distribution
does not. Outliers use the robust z-score of Iglewicz and Hoaglin::

    z = 0.6745 * (x - median) / MAD        flagged when |z| > 3.5

with two guards: when MAD is 0 (more than half the values identical) the mean absolute deviation,
scaled by 1.2533 to estimate the same sigma, takes its place; and a value must also be at least
``min_rel`` (2 % by default) away from the median, so a very tight fleet does not flag noise.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpufleet.checks.baselines import Baseline
from gpufleet.checks.model import CheckResult
from gpufleet.domain.errors import InvalidInput

MAD_TO_Z = 0.6745  # Phi^-1(0.75): makes MAD comparable with a standard deviation
MEANAD_TO_SIGMA = 1.2533  # sqrt(pi / 2): the same for the mean absolute deviation


class Side(StrEnum):
    LOW = "low"  # throughput and bandwidth: only too-low values are a problem
    HIGH = "high"
    BOTH = "both"


@dataclass(frozen=True, slots=True)
class FleetSample:
    node: str
    gpu: int | None
    sku: str
    check: str
    value: float
    unit: str


@dataclass(frozen=True, slots=True)
class Distribution:
    sku: str
    check: str
    unit: str
    n: int
    median: float
    mad: float
    p05: float
    p95: float
    minimum: float
    maximum: float


@dataclass(frozen=True, slots=True)
class Outlier:
    sample: FleetSample
    z: float
    median: float
    scale: float  # the sigma estimate used (MAD-based, or mean-AD-based when MAD is 0)


def samples_from_results(node: str, sku: str, results: Iterable[CheckResult]) -> list[FleetSample]:
    """One node's check results as fleet samples (what the controller accumulates)."""
    return [FleetSample(node, r.gpu, sku, r.check, r.value, r.unit) for r in results]


def _groups(samples: Iterable[FleetSample]) -> dict[tuple[str, str, str], list[FleetSample]]:
    out: dict[tuple[str, str, str], list[FleetSample]] = {}
    for s in samples:
        out.setdefault((s.sku, s.check, s.unit), []).append(s)
    return out


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of already-sorted values."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def distributions(samples: Iterable[FleetSample]) -> list[Distribution]:
    """Per (SKU, check, unit): count, median, MAD, 5th/95th percentile, min and max."""
    out: list[Distribution] = []
    for (sku, check, unit), group in sorted(_groups(samples).items()):
        values = sorted(s.value for s in group)
        med = statistics.median(values)
        mad = statistics.median(abs(v - med) for v in values)
        out.append(
            Distribution(
                sku=sku,
                check=check,
                unit=unit,
                n=len(values),
                median=med,
                mad=mad,
                p05=_quantile(values, 0.05),
                p95=_quantile(values, 0.95),
                minimum=values[0],
                maximum=values[-1],
            )
        )
    return out


def outliers(
    samples: Iterable[FleetSample],
    *,
    threshold: float = 3.5,
    min_samples: int = 8,
    min_rel: float = 0.02,
    side: Side = Side.LOW,
) -> list[Outlier]:
    """Samples whose robust z-score within their (SKU, check, unit) group passes ``threshold``.

    Groups smaller than ``min_samples`` are not judged (too few to know what normal is). Result order:
    most extreme first.
    """
    if threshold <= 0:
        raise InvalidInput("threshold", threshold, "a positive robust z-score, e.g. 3.5")
    if min_samples < 3:
        raise InvalidInput("min_samples", min_samples, "at least 3")
    if not 0 <= min_rel < 1:
        raise InvalidInput("min_rel", min_rel, "a fraction in [0, 1)")
    found: list[Outlier] = []
    for group in _groups(samples).values():
        if len(group) < min_samples:
            continue
        values = [s.value for s in group]
        med = statistics.median(values)
        mad = statistics.median(abs(v - med) for v in values)
        scale = mad / MAD_TO_Z if mad > 0 else MEANAD_TO_SIGMA * statistics.fmean(abs(v - med) for v in values)
        if scale == 0:
            continue  # every value identical: nothing stands out
        for s in group:
            z = (s.value - med) / scale
            far_enough = abs(s.value - med) >= min_rel * abs(med)
            if not far_enough or abs(z) <= threshold:
                continue
            if (side is Side.LOW and z > 0) or (side is Side.HIGH and z < 0):
                continue
            found.append(Outlier(sample=s, z=round(z, 3), median=med, scale=scale))
    return sorted(found, key=lambda o: -abs(o.z))


def derive_baselines(
    samples: Iterable[FleetSample], *, floor_sigmas: float = 3.0, min_samples: int = 8, source: str = ""
) -> list[Baseline]:
    """Bars learned from the fleet (SuperBench's generate-baseline idea): expected = median, floor =
    median - ``floor_sigmas`` robust sigmas (never below 0). Groups under ``min_samples`` are left out."""
    out: list[Baseline] = []
    for (sku, check, unit), group in sorted(_groups(samples).items()):
        if len(group) < min_samples:
            continue
        values = [s.value for s in group]
        med = statistics.median(values)
        sigma = statistics.median(abs(v - med) for v in values) / MAD_TO_Z
        note = source or f"derived from {len(values)} fleet results: median - {floor_sigmas:g} robust sigma"
        out.append(
            Baseline(
                sku=sku,
                check=check,
                unit=unit,
                floor=max(0.0, med - floor_sigmas * sigma),
                expected=med,
                source=note,
            )
        )
    return out
