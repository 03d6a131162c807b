"""A unit's witnesses are its parts: their count is bounded, and its tail is binomial, not Poisson."""

from __future__ import annotations

import math

from gpufleet.correlate.engine import Engine
from gpufleet.correlate.model import SuspectAction, VerdictStatus
from gpufleet.correlate.tails import log_binom_tail, log_count_tail, log_poisson_tail
from gpufleet.domain.events import EventKind as E
from gpufleet.domain.topology_gen import generate_nvl72
from tests.unit.correlate.helpers import Stream

TOPO = generate_nvl72(2)
TRAY = "r01-ct05"


def test_binomial_tail_matches_the_closed_form() -> None:
    for n, p in ((8, 0.018), (2, 0.3), (20, 0.01)):
        for k in range(0, n + 1):
            exact = sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1))
            assert math.isclose(math.exp(log_binom_tail(k, n, p)), exact, rel_tol=1e-9)
    assert log_binom_tail(9, 8, 0.5) == -math.inf  # more witnesses than parts: impossible
    assert log_binom_tail(3, 8, 1.0) == 0.0


def test_a_units_count_tail_is_binomial_from_mu_plus_one_and_never_above_poisson() -> None:
    for n in (2, 8, 20):
        for mu in (0.01, 0.145, 0.9):
            for k in range(1, n + 1):
                got = log_count_tail(k, mu, n)
                assert got <= log_poisson_tail(k, mu) + 1e-12
                assert got == (log_binom_tail(k, n, mu / n) if k >= mu + 1 else log_poisson_tail(k, mu))
    assert log_count_tail(4, 0.145, 0) == log_poisson_tail(4, 0.145)  # not a unit: Poisson
    # The NVL72 tray of docs/correlate.md: four of its eight parts within five minutes, mu_s = 0.051.
    assert (log_poisson_tail(4, 0.051) - log_count_tail(4, 0.051, 8)) / math.log(10) > 0.3


def _tray_stream(gap: float) -> Stream:
    """One unrelated GPU logs a corrected ECC error; then three GPUs of TRAY (each on another link)
    and its NIC (a corrected AER) report once each, ``gap`` seconds apart."""
    s = Stream()
    s.add(5, E.ECC_SBE, "r02-ct09-gpu1")
    for j in range(3):
        gpu = f"{TRAY}-gpu{j}"
        link = [lid for lid in TOPO.links_of(gpu) if TOPO.links[lid].kind == "nvlink"][j]
        s.add(300 + gap * j, E.LINK_ERROR, gpu, link=link)
    s.add(300 + gap * 3, E.AER_CORRECTED, f"{TRAY}-nic0")
    return s


def _actionable(s: Stream) -> list[str]:
    eng = Engine(TOPO)
    return [v.suspect.component for ev in s.events for v in eng.observe(ev)
            if v.status is not VerdictStatus.CLEARED and v.suspect.action is not SuspectAction.OBSERVE]


def test_four_of_a_trays_eight_parts_within_four_minutes_name_the_tray() -> None:
    # Poisson(mu) lets a tray have more than eight witnesses; with the bound, four of eight parts a
    # minute apart are significant (under Poisson they were not).
    assert _actionable(_tray_stream(60))[:1] == [TRAY]
    assert _actionable(_tray_stream(240)) == []  # spread over twelve minutes: background
