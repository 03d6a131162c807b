"""What a training run's lost time costs: the effective price of a *useful* GPU-hour.

A GPU-hour bought at ``price`` does useful work only for the share of wall-clock time the job trains
(ETTR) and, while it trains, only at the share of the GPU's peak the model reaches (MFU). So

* price per **productive** GPU-hour = price / ETTR (what the goodput losses cost), and
* price per **useful** GPU-hour = price / (ETTR x MFU): the cost of one GPU-hour of work at the GPU's
  peak rate, the figure to compare two clusters, two policy mixes or two models by;
* the money lost to badput = price x GPUs x elapsed hours x (1 - ETTR).

Pure: the report (``gpufleet goodput report --price-per-gpu-hour``) and the simulator's sweeps
(``gpufleet sim --sweep --price-per-gpu-hour --mfu``) both call :func:`tco`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufleet.domain.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class Tco:
    price_per_gpu_hour: float
    gpus: int
    gpu_hours: float  # bought: GPUs x elapsed hours
    ettr: float
    mfu: float | None  # MFU while training (None: unknown)
    cost: float  # price x gpu_hours
    badput_cost: float  # the share of ``cost`` spent on anything but training
    per_productive_gpu_hour: float  # price / ETTR (inf when nothing trained)
    per_useful_gpu_hour: float | None  # price / (ETTR x MFU)

    def as_dict(self) -> dict[str, float | int | None]:
        return {"price_per_gpu_hour": self.price_per_gpu_hour, "gpus": self.gpus, "gpu_hours": self.gpu_hours,
                "ettr": self.ettr, "mfu": self.mfu, "cost": self.cost, "badput_cost": self.badput_cost,
                "per_productive_gpu_hour": _finite(self.per_productive_gpu_hour),
                "per_useful_gpu_hour": None if self.per_useful_gpu_hour is None
                else _finite(self.per_useful_gpu_hour)}


def tco(price_per_gpu_hour: float, gpus: int, elapsed_s: float, ettr: float, mfu: float | None = None) -> Tco:
    if not (math.isfinite(price_per_gpu_hour) and price_per_gpu_hour > 0):
        raise InvalidInput("price_per_gpu_hour", price_per_gpu_hour, "a positive price per GPU-hour")
    if gpus < 1:
        raise InvalidInput("gpus", gpus, "1 or more GPUs")
    if not 0.0 <= ettr <= 1.0:
        raise InvalidInput("ettr", ettr, "a share between 0 and 1")
    if mfu is not None and not 0.0 < mfu <= 1.0:
        raise InvalidInput("mfu", mfu, "a share above 0 and at most 1")
    gpu_hours = gpus * max(elapsed_s, 0.0) / 3600.0
    cost = price_per_gpu_hour * gpu_hours
    productive = price_per_gpu_hour / ettr if ettr > 0 else math.inf
    useful = None if mfu is None else (price_per_gpu_hour / (ettr * mfu) if ettr > 0 else math.inf)
    return Tco(price_per_gpu_hour, gpus, gpu_hours, ettr, mfu, cost, cost * (1.0 - ettr), productive, useful)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
