"""Closed forms: optimal checkpoint intervals and expected ETTR.

All times are seconds, rates are per second unless a name says otherwise.

* Young (1974): ``T_opt = sqrt(2 C M)`` for checkpoint cost C and mean time between failures M.
* Daly (2006): ``tau_opt = sqrt(2 d M) [1 + 1/3 sqrt(d / 2M) + 1/9 (d / 2M)] - d`` for d < 2M, else M.
* Kokolis et al. (2024): ``E[ETTR] ~ [1 - N r_f (u0 + dt/2)] / (1 + w/dt)`` (first-order; N nodes,
  r_f failures per node-day, u0 restart overhead, dt checkpoint interval, w blocking write).
* Exact renewal ETTR for Poisson failures at rate ``lam`` that strike at any moment of a running
  attempt (restart included), with segments of ``dt`` training + ``w`` blocking save and restart
  cost ``r``: one segment takes ``E[T] = e^{lam r} (e^{lam (dt + w)} - 1) / lam`` in expectation, so
  ``ETTR = dt / E[T]`` by the renewal-reward theorem. With failures only outside the restart
  (``restart_exposed=False``) ``E[T] = (e^{lam (dt + w)} - 1) (r + 1/lam)``.
"""

from __future__ import annotations

import math

from gpufleet.domain.errors import InvalidInput

DAY = 86400.0


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise InvalidInput(name, value, "a positive finite number")


def _non_negative(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
        raise InvalidInput(name, value, "a non-negative finite number")


def mtbf(gpus: int, failures_per_gpu_hour: float) -> float:
    """Job-level mean time between failures (seconds) of a series system of ``gpus`` GPUs."""
    _positive("gpus", gpus)
    _positive("failures_per_gpu_hour", failures_per_gpu_hour)
    return 3600.0 / (gpus * failures_per_gpu_hour)


def mtbf_from_node_rate(nodes: int, failures_per_node_day: float) -> float:
    """Kokolis's ``MTTF = (N_nodes r_f)^-1``, in seconds."""
    _positive("nodes", nodes)
    _positive("failures_per_node_day", failures_per_node_day)
    return DAY / (nodes * failures_per_node_day)


def young_interval(checkpoint_cost: float, mtbf_s: float) -> float:
    """Young's optimal checkpoint interval ``sqrt(2 C M)``."""
    _non_negative("checkpoint_cost", checkpoint_cost)
    _positive("mtbf", mtbf_s)
    return math.sqrt(2.0 * checkpoint_cost * mtbf_s)


def daly_interval(checkpoint_cost: float, mtbf_s: float) -> float:
    """Daly's higher-order optimal interval (compute time between checkpoints)."""
    _non_negative("checkpoint_cost", checkpoint_cost)
    _positive("mtbf", mtbf_s)
    d, m = checkpoint_cost, mtbf_s
    if d >= 2.0 * m:
        return m
    x = d / (2.0 * m)
    return math.sqrt(2.0 * d * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - d


def expected_ettr_approx(
    nodes: int, failures_per_node_day: float, restart: float, interval: float, write: float = 0.0
) -> float:
    """Kokolis's first-order E[ETTR], clipped to [0, 1]."""
    _positive("nodes", nodes)
    _non_negative("failures_per_node_day", failures_per_node_day)
    _non_negative("restart", restart)
    _positive("interval", interval)
    _non_negative("write", write)
    rate = nodes * failures_per_node_day / DAY
    value = (1.0 - rate * (restart + interval / 2.0)) / (1.0 + write / interval)
    return min(1.0, max(0.0, value))


def segment_time(rate: float, interval: float, write: float, restart: float, *, restart_exposed: bool = True) -> float:
    """Expected wall time to complete one segment (``interval`` training + ``write`` save)."""
    _non_negative("rate", rate)
    _positive("interval", interval)
    _non_negative("write", write)
    _non_negative("restart", restart)
    s = interval + write
    if rate == 0:
        return s
    grow = math.expm1(rate * s)
    if restart_exposed:
        return math.exp(rate * restart) * grow / rate
    return grow * (restart + 1.0 / rate)


def expected_ettr_exact(
    rate: float, interval: float, write: float, restart: float, *, restart_exposed: bool = True
) -> float:
    """Exact long-run ETTR for Poisson failures (renewal-reward; see the module docstring)."""
    return interval / segment_time(rate, interval, write, restart, restart_exposed=restart_exposed)


def optimal_interval_exact(rate: float, write: float, restart: float, *, restart_exposed: bool = True) -> float:
    """The interval that maximises :func:`expected_ettr_exact` (golden-section search)."""
    _positive("rate", rate)
    lo, hi = 1e-3, 50.0 / rate
    g = (math.sqrt(5.0) - 1.0) / 2.0

    def f(x: float) -> float:
        return -expected_ettr_exact(rate, x, write, restart, restart_exposed=restart_exposed)

    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(200):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
        if b - a < 1e-6 * max(1.0, b):
            break
    return (a + b) / 2.0
