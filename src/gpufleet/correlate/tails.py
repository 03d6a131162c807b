"""Tail probabilities the coherence statistic needs (log scale, stable far into the tail)."""

from __future__ import annotations

import math


def log_poisson_tail(k: int, mu: float) -> float:
    """ln P(X >= k), X ~ Poisson(mu)."""
    if k <= 0:
        return 0.0
    mu = max(mu, 1e-12)
    term = math.exp(-mu)
    cdf = 0.0
    for i in range(k):
        cdf += term
        term *= mu / (i + 1)
    tail = 1.0 - cdf
    if tail > 1e-12:
        return math.log(tail)
    # far tail: the first term dominates
    return -mu + k * math.log(mu) - math.lgamma(k + 1) + math.log1p(mu / (k + 1))


def log_negbin_tail(e: int, size: float, p: float) -> float:
    """ln P(Y >= e), Y negative binomial with (real) ``size`` and success probability ``p``:
    P(Y = j) = Gamma(j + size) / (j! Gamma(size)) p^size (1-p)^j (mean size (1-p)/p)."""
    if e <= 0 or size <= 0:
        return 0.0
    q = 1.0 - p
    cdf = 0.0
    term = p**size  # P(Y = 0)
    for j in range(e):
        cdf += term
        term *= q * (j + size) / (j + 1)
    tail = 1.0 - cdf
    return math.log(tail) if tail > 1e-12 else math.log(max(term, 1e-300))
