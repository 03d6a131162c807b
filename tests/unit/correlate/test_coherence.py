"""Evidence from coherence: many distinct reporters sharing one candidate, each with one weak event."""

from __future__ import annotations

import math
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.correlate.engine import Engine
from gpufleet.correlate.model import Basis, SuspectAction, VerdictStatus
from gpufleet.correlate.tails import log_negbin_tail as _log_negbin_tail
from gpufleet.correlate.tails import log_poisson_tail as _log_poisson_tail
from gpufleet.domain.events import EventKind as E
from gpufleet.domain.fleet import ComponentKind as K
from gpufleet.domain.topology_gen import generate_nvl72
from tests.unit.correlate.helpers import Stream

TOPO = generate_nvl72(2)
CHIP = "r01-sw3-nvsw1"
TRAYS = TOPO.of_kind(K.COMPUTE_TRAY)


def _port(tray: str, gpu: int = 0, chip: str = CHIP) -> str:
    return f"{tray}-gpu{gpu}~{chip}"


def _twelve_trays(s: Stream, n: int = 12) -> None:
    """n GPUs, each in another tray of rack r01, report ONE link error on their port to CHIP."""
    trays = [t for t in TRAYS if t.startswith("r01-")][:n]
    for i, tray in enumerate(trays):
        s.add(10 + 20 * i, E.LINK_ERROR, f"{tray}-gpu{i % 4}", link=_port(tray, i % 4))


def _actionable(eng: Engine, s: Stream) -> list[str]:
    out = []
    for ev in s.events:
        for v in eng.observe(ev):
            if v.status is not VerdictStatus.CLEARED and v.suspect.action is not SuspectAction.OBSERVE:
                out.append(v.suspect.component)
    return out


def test_twelve_single_link_errors_to_one_chip_name_the_chip() -> None:
    s = Stream()
    _twelve_trays(s)
    eng = Engine(TOPO)
    assert _actionable(eng, s) == [CHIP]
    top = eng.suspects()[0]
    assert top.component == CHIP and top.action is SuspectAction.DRAIN_AND_REPLACE
    assert top.confidence >= 0.9 and len(top.evidence) == 12
    assert top.finding is Basis.DEGRADING and "weak signals only" in top.reason  # no event reached a count
    # Without the coherence statistic (counts only) the same stream explains nothing.
    assert _actionable(Engine(TOPO, coherence=False), s) == []


def test_three_trays_are_not_enough_for_a_chip() -> None:
    s = Stream()
    _twelve_trays(s, 3)
    eng = Engine(TOPO)
    assert _actionable(eng, s) == []
    assert eng.coherence is not None and not eng.coherence.is_significant(CHIP)


def test_one_noisy_chip_naming_many_ports_is_one_witness() -> None:
    s = Stream()
    for i, tray in enumerate(TRAYS[:18]):  # the chip itself logs a non-fatal SXID on 18 ports
        s.add(5 * i, E.SXID, CHIP, code=20009, link=_port(tray))
    eng = Engine(TOPO)
    assert _actionable(eng, s) == []
    assert eng.coherence is not None and not eng.coherence.is_significant(CHIP)


def test_the_same_pattern_spread_beyond_the_coherence_window_is_not_significant() -> None:
    s = Stream()
    trays = [t for t in TRAYS if t.startswith("r01-")][:12]
    for i, tray in enumerate(trays):  # one every 20 minutes: never more than one in a window
        s.add(1200 * i, E.LINK_ERROR, f"{tray}-gpu0", link=_port(tray))
    eng = Engine(TOPO, window=timedelta(hours=6))
    assert _actionable(eng, s) == []


def test_poisson_and_negative_binomial_tails_match_closed_forms() -> None:
    for mu in (1e-4, 0.03, 0.7, 3.0):
        assert math.isclose(_log_poisson_tail(1, mu), math.log(-math.expm1(-mu)), rel_tol=1e-6)
        two = 1.0 - math.exp(-mu) * (1.0 + mu)
        assert math.isclose(_log_poisson_tail(2, mu), math.log(two), rel_tol=1e-4)
    assert _log_poisson_tail(0, 0.1) == 0.0
    # size 1 is geometric: P(Y >= e) = (1 - p)**e
    for p in (0.2, 0.5, 0.8):
        for e in (1, 3, 7):
            assert math.isclose(_log_negbin_tail(e, 1, p), e * math.log(1 - p), rel_tol=1e-6)
    # size 2: P(Y >= 1) = 1 - p**2
    assert math.isclose(_log_negbin_tail(1, 2, 0.5), math.log(0.75), rel_tol=1e-9)
    # a real size against the pmf summed from log-gamma
    for size, p, e in ((0.7, 0.4, 3), (3.3, 0.8, 5), (12.5, 0.9, 2)):
        pmf = [math.exp(math.lgamma(j + size) - math.lgamma(j + 1) - math.lgamma(size)
                        + size * math.log(p) + j * math.log(1 - p)) for j in range(e)]
        assert math.isclose(_log_negbin_tail(e, size, p), math.log(1 - sum(pmf)), rel_tol=1e-9)


# -- properties -------------------------------------------------------------------------------------------

CHIPS = TOPO.of_kind(K.NVSWITCH)


@st.composite
def sparse_noise(draw: st.DrawFn) -> Stream:
    """Weak events (corrected link errors, non-fatal SXIDs, SBEs, corrected AERs) from reporters that
    never put three distinct trays on one chip, nor two events in one tray: what background looks like."""
    s = Stream()
    per_chip: dict[str, set[str]] = {}
    used_trays: set[str] = set()
    at = 0.0
    for _ in range(draw(st.integers(1, 40))):
        at += draw(st.floats(0, 120))
        tray = draw(st.sampled_from(TRAYS))
        what = draw(st.sampled_from(["link", "sxid", "sbe", "aer"]))
        if tray in used_trays:
            continue
        gpu, chip = draw(st.integers(0, 3)), draw(st.sampled_from(CHIPS))
        if what in ("link", "sxid") and len(per_chip.setdefault(chip, set()) | {tray}) > 2:
            continue
        used_trays.add(tray)
        for _ in range(draw(st.integers(1, 2))):
            if what == "link":
                per_chip[chip].add(tray)
                s.add(at, E.LINK_ERROR, f"{tray}-gpu{gpu}", link=_port(tray, gpu, chip))
            elif what == "sxid":
                per_chip[chip].add(tray)
                s.add(at, E.SXID, chip, code=draw(st.sampled_from([11012, 20001, 20009, 22013])),
                      link=_port(tray, gpu, chip))
            elif what == "sbe":
                s.add(at, E.ECC_SBE, f"{tray}-gpu{gpu}")
            else:
                s.add(at, E.AER_CORRECTED, f"{tray}-nic{gpu}")
            at += draw(st.floats(0, 60))
    return s


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sparse_noise())
def test_pure_noise_never_creates_an_actionable_verdict(noise: Stream) -> None:
    eng = Engine(TOPO)
    assert _actionable(eng, noise) == []
    assert all(s.action is SuspectAction.OBSERVE for s in eng.suspects())


def test_a_weak_pattern_that_turns_into_a_fault_is_no_longer_only_degrading() -> None:
    s = Stream()
    _twelve_trays(s)
    trays = [t for t in TRAYS if t.startswith("r01-")][:12]
    s.add(400, E.SXID, CHIP, code=20034, link=_port(trays[0]))  # the chip fails: a fatal SXID
    eng = Engine(TOPO)
    _actionable(eng, s)
    top = eng.suspects()[0]
    assert top.component == CHIP and top.finding is Basis.SHARED


def _chip_confidence(reports: list[tuple[float, int]]) -> float:
    s = Stream()
    r01 = [t for t in TRAYS if t.startswith("r01-")]
    for at, i in sorted(reports):
        tray = r01[i]
        s.add(at, E.LINK_ERROR, f"{tray}-gpu{i % 4}", link=_port(tray, i % 4))
    eng = Engine(TOPO)
    _actionable(eng, s)
    return max((x.confidence for x in eng.suspects() if x.component == CHIP), default=0.0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.floats(0, 600), st.integers(0, 17)), min_size=1, max_size=10,
                unique_by=lambda r: r[1]),
       st.floats(0, 600), st.integers(0, 17))
def test_adding_a_witness_never_lowers_the_chips_confidence(
    reports: list[tuple[float, int]], at: float, tray: int
) -> None:
    """One more distinct tray reporting on the chip (within the window, at any time, however few
    reported before) is more evidence, never less — even though the learned background rate rises
    with every report."""
    if any(i == tray for _, i in reports):
        return
    before = _chip_confidence(reports)
    after = _chip_confidence([*reports, (at, tray)])
    assert after >= before - 1e-9, (before, after)
