"""Straggler detection: a rank that slows against its peers is named; load that slows everyone is not."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime

import pytest

from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind
from gpufleet.goodput.straggler import RankSeries, find_stragglers, straggler_event


def _fleet(ranks: int = 8, steps: int = 200, slow: dict[int, tuple[int, int, float]] | None = None,
           seed: int = 1) -> list[RankSeries]:
    """Step times with a strong diurnal-like drift shared by all ranks and 3 % noise; ``slow`` maps a rank
    to (from step, to step, factor)."""
    rng = random.Random(seed)
    out = []
    for r in range(ranks):
        pts = []
        for s in range(steps):
            t = 0.1 * (1 + 0.6 * math.sin(2 * math.pi * s / 80)) * rng.gauss(1.0, 0.03)
            if slow and r in slow and slow[r][0] <= s < slow[r][1]:
                t *= slow[r][2]
            pts.append((s, t))
        out.append(RankSeries(r, f"n{r // 4}", r % 4, tuple(pts)))
    return out


def test_shared_drift_names_nobody() -> None:
    assert find_stragglers(_fleet()) == ()


def test_a_rank_that_slows_is_named_from_where_it_slowed() -> None:
    found = find_stragglers(_fleet(slow={5: (120, 200, 1.3)}))
    assert [s.rank for s in found] == [5]
    s = found[0]
    assert (s.host, s.local_rank) == ("n1", 1)
    assert 117 <= s.from_step <= 123
    assert s.slowdown == pytest.approx(1.3, rel=0.05)
    assert s.before == pytest.approx(1.0, abs=0.05)


def test_two_ranks_are_enough() -> None:
    found = find_stragglers(_fleet(ranks=2, steps=60, slow={1: (25, 60, 2.0)}))
    assert [(s.rank, 22 <= s.from_step <= 28) for s in found] == [(1, True)]


def test_a_rank_slow_from_its_first_step_is_named_from_the_start() -> None:
    found = find_stragglers(_fleet(slow={2: (0, 200, 1.5)}))
    assert [(s.rank, s.from_step, math.isinf(s.score)) for s in found] == [(2, 0, True)]


def test_a_rank_that_recovered_is_not_named() -> None:
    assert find_stragglers(_fleet(slow={3: (40, 100, 1.5)})) == ()


def test_a_mild_slowdown_below_the_threshold_is_not_named() -> None:
    assert find_stragglers(_fleet(slow={3: (100, 200, 1.08)})) == ()


def test_bad_thresholds_are_refused() -> None:
    with pytest.raises(InvalidInput) as err:
        find_stragglers(_fleet(), min_slowdown=0)
    assert err.value.field == "min_slowdown"


def test_the_event_is_an_observation_with_evidence_and_no_severity() -> None:
    s = find_stragglers(_fleet(slow={5: (120, 200, 1.3)}))[0]
    e = straggler_event(s, job="4242", time=datetime(2026, 11, 21, 12, tzinfo=UTC))
    assert (e.kind, e.node, e.component, e.severity) == (EventKind.CHECK_FAILED, "n1", "n1-gpu1", None)
    attrs = dict(e.attrs)
    assert attrs["rule"] == "straggler" and attrs["job"] == "4242" and attrs["rank"] == "5"
    assert attrs["from_step"] == str(s.from_step)


def test_the_shipped_catalog_judges_a_straggler() -> None:
    from gpufleet.domain.catalog import load_default_catalog
    from gpufleet.domain.events import Severity
    from gpufleet.domain.judgement import judge_event

    s = find_stragglers(_fleet(slow={5: (120, 200, 1.3)}))[0]
    j = judge_event(load_default_catalog(), straggler_event(s, job="1", time=datetime(2026, 1, 1, tzinfo=UTC)))
    assert (j.severity, j.basis) == (Severity.DEGRADED, "catalog")


def test_heavy_tailed_noise_does_not_hide_or_invent_a_straggler() -> None:
    """Step times on a shared, oversubscribed host: 1 step in 10 takes 2-10x on any rank."""
    rng = random.Random(7)

    def noisy(series: list[RankSeries]) -> list[RankSeries]:
        return [RankSeries(s.rank, s.host, s.local_rank,
                           tuple((st, t * (rng.uniform(2, 10) if rng.random() < 0.1 else 1.0)) for st, t in s.points))
                for s in series]

    assert find_stragglers(noisy(_fleet(ranks=2, steps=70))) == ()
    found = find_stragglers(noisy(_fleet(ranks=2, steps=70, slow={1: (25, 70, 2.0)})))
    assert [s.rank for s in found] == [1] and 22 <= found[0].from_step <= 28
