"""The state the coherence statistic keeps incrementally equals a straightforward recomputation.

The per-event path keeps sums as they change instead of re-summing them (a candidate's witness units,
the rate window's reporters and their excess minutes), finds stale reporters with a queue (a heap for
late entries), keeps a candidate with one witness on one symptom as a tuple, memoises tail
probabilities and shares placements per topology. These tests drive an engine over generated streams
(late events included) and compare that state, after every event and at every rate refresh, with the
plain computation it replaces (the code before it).
"""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.correlate import coherence as co
from gpufleet.correlate import rates
from gpufleet.correlate.engine import Engine
from gpufleet.correlate.index import index_of
from gpufleet.correlate.tails import log_negbin_tail, log_poisson_tail
from gpufleet.domain.eventio import FileEvent
from gpufleet.domain.events import EventKind as E
from gpufleet.domain.fleet import ComponentKind as K
from gpufleet.domain.topology_gen import generate_nvl72
from tests.unit.correlate.helpers import T0

TOPO = generate_nvl72(1)
LINKS = sorted(TOPO.links)
CHIPS = sorted(TOPO.of_kind(K.NVSWITCH))
GPUS = sorted(TOPO.of_kind(K.GPU))
NICS = sorted(TOPO.of_kind(K.NIC))


@st.composite
def weak_streams(draw: st.DrawFn) -> list[FileEvent]:
    """Weak (coherent) events over hours, half of them on ports of one hot chip; times step back now
    and then (late events inside the window)."""
    hot = draw(st.sampled_from(CHIPS))
    hot_ports = [ln for ln in LINKS if hot in (TOPO.links[ln].a, TOPO.links[ln].b)]
    out: list[FileEvent] = []
    at = 0.0
    for i in range(draw(st.integers(1, 160))):
        at = max(0.0, at + draw(st.floats(-400, 400)))
        pick = draw(st.integers(0, 5))
        if pick <= 2:
            link = draw(st.sampled_from(hot_ports if pick < 2 else LINKS))
            ln = TOPO.links[link]
            comp = ln.a if draw(st.booleans()) else ln.b
            kind, code = (E.SXID, 20009) if comp in CHIPS and draw(st.booleans()) else (E.LINK_ERROR, None)
        else:
            link = None
            kind, comp, code = draw(st.sampled_from([(E.ECC_SBE, g, None) for g in GPUS[:12]]
                                                    + [(E.AER_CORRECTED, n, None) for n in NICS[:6]]
                                                    + [(E.LINK_ERROR, n, None) for n in NICS[:6]]))
        out.append(FileEvent(line=i, time=T0 + timedelta(seconds=at), kind=kind, component=comp, code=code,
                             link=link))
    return out


class _Reference:
    """The rate window as the code before it kept it: reporters by (kind, class), stale ones found by a
    scan at each refresh, the sums taken afresh."""

    def __init__(self, coh: co.Coherence) -> None:
        self.coh = coh
        self.seen: dict[tuple[str, str], dict[str, tuple[float, int, int]]] = {}
        # the same for reports naming a link by a component with one link (a NIC): the cable-end rate
        self.seen_link: dict[tuple[str, str], dict[str, tuple[float, int, int]]] = {}
        add, refresh = coh.add, coh._refresh

        def checked_add(t: float, kind: str, reporter: str, rclass: str, *rest: object) -> list[str]:
            key = rest[0]
            assert isinstance(key, tuple)
            minute = int(t // co.UNIT_S)
            mirrors = [self.seen]
            if key[1] and len(TOPO.links_of(reporter)) == 1 and reporter in (TOPO.links[key[1]].a,
                                                                              TOPO.links[key[1]].b):
                mirrors.append(self.seen_link)
            for mirror in mirrors:
                seen = mirror.setdefault((kind, rclass), {})
                prev = seen.get(reporter)
                if prev is None:
                    seen[reporter] = (t, 1, minute)
                elif prev[2] != minute:
                    seen[reporter] = (t, prev[1] + 1, minute)
            return add(t, kind, reporter, rclass, *rest)  # type: ignore[arg-type]

        def checked_refresh(t: float) -> None:
            refresh(t)
            self.check_rates(t)

        coh.add = checked_add  # type: ignore[method-assign]
        coh._refresh = checked_refresh  # type: ignore[method-assign]

    def check_rates(self, t: float) -> None:
        coh = self.coh
        cutoff = t - coh._rate_window
        windows = max(coh.window, min(coh._rate_window, t - coh._start)) / coh.window
        per_class: dict[str, float] = {}
        active = excess = excess2 = 0
        for key, seen in self.seen.items():
            for r in [r for r, v in seen.items() if v[0] < cutoff]:
                del seen[r]
            assert coh._seen[key].last == seen
            n = 0
            for r, v in seen.items():
                if coh._explained.get(r, -math.inf) > t:
                    continue
                n += 1
                active += 1
                excess += v[1] - 1
                excess2 += (v[1] - 1) ** 2
            cls = key[1]
            size = coh._class_size.get(cls, 1)
            rate = (rates.PRIOR_Q * rates.PRIOR_WEIGHT + n / windows) / (rates.PRIOR_WEIGHT + size)
            per_class[cls] = per_class.get(cls, 0.0) + rate
        assert coh._q == per_class
        link_rates: dict[str, float] = {}
        for key, seen in list(self.seen_link.items()):
            for r in [r for r, v in seen.items() if v[0] < cutoff]:
                del seen[r]
            if not seen:  # named no link in the rate window: dropped (the any-report rate stands in)
                del self.seen_link[key]
                continue
            assert coh._seen_link[key].last == seen
            n = sum(1 for r in seen if coh._explained.get(r, -math.inf) <= t)
            cls = key[1]
            size = coh._class_size.get(cls, 1)
            rate = (rates.PRIOR_Q * rates.PRIOR_WEIGHT + n / windows) / (rates.PRIOR_WEIGHT + size)
            link_rates[cls] = link_rates.get(cls, 0.0) + rate
        assert coh._q_link == link_rates and set(coh._seen_link) == set(self.seen_link)
        w = rates.PRIOR_REP_WEIGHT
        m = (rates.PRIOR_EXCESS * w + excess) / (w + active)
        var = (rates.PRIOR_EXCESS * (1 + rates.PRIOR_EXCESS) * w + excess2) / (w + active) - m * m
        assert coh._rep == (m, m * m / (var - m) if var > m * 1.001 else math.inf)


def _check_state(eng: Engine) -> None:
    coh = eng.coherence
    assert coh is not None
    for c, kept in coh._cands.items():
        state = co.cand_of(kept, coh._cls(c)) if isinstance(kept, tuple) else kept  # seen once: its Cand
        assert state.units == sum(v[1] for v in state.wit.values())
        assert all(state.oldest <= v[0] for v in state.wit.values())
        assert state.cls == coh._cls(c)
    for seen in [*coh._seen.values(), *coh._seen_link.values()]:
        assert seen.n == len(seen.last)
        assert seen.excess == sum(v[1] - 1 for v in seen.last.values())
        assert seen.excess2 == sum((v[1] - 1) ** 2 for v in seen.last.values())
        assert {(v[0], r) for r, v in seen.last.items()} <= {*seen.queue, *seen.heap}
        assert all(a[0] <= b[0] for a, b in zip(seen.queue, list(seen.queue)[1:], strict=False))  # in time order
    for (k, mu), lp in coh._poisson_memo.items():
        assert lp == log_poisson_tail(k, mu)
    m, size = coh._rep
    for (e, k), lp in coh._rep_memo.items():
        poisson = size == math.inf
        assert lp == (log_poisson_tail(e, k * m) if poisson else log_negbin_tail(e, k * size, size / (size + m)))
    for sym in eng._syms.values():
        if sym.cands:
            assert sym.cands == eng._candidates(sym.reporter, sym.link or None)
        if sym.wit is not None:
            assert sym.wit == eng._pairs(sym)


@pytest.mark.patches_internals  # replaces Coherence methods on an object: pure-Python build only
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(weak_streams())
def test_kept_state_equals_the_plain_recomputation(events: list[FileEvent]) -> None:
    eng = Engine(TOPO)
    assert eng.coherence is not None
    _Reference(eng.coherence)  # checks the rates at every refresh
    for ev in events:
        eng.observe(ev)
        _check_state(eng)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(weak_streams())
def test_verdicts_do_not_depend_on_what_the_topology_index_already_holds(events: list[FileEvent]) -> None:
    def run() -> list[tuple[object, ...]]:
        eng = Engine(TOPO)
        out = [(v.status, v.suspect) for ev in events for v in eng.observe(ev)]
        return [*out, *eng.suspects()]

    idx = index_of(TOPO)
    for memo in (idx.placements, idx.exposure, idx.kinds, idx.units, idx.degree):
        memo.clear()
    cold = run()
    assert run() == cold  # every placement, exposure and kind now comes from the shared index
