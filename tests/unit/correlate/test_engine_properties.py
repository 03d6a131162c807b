"""Properties of the engine over arbitrary event streams (Hypothesis)."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.correlate.engine import Engine
from gpufleet.correlate.model import SuspectAction, VerdictStatus
from gpufleet.domain.eventio import FileEvent
from gpufleet.domain.events import EventKind as E
from gpufleet.domain.topology_gen import generate_nvl72
from tests.unit.correlate.helpers import T0

TOPO = generate_nvl72(1)
COMPONENTS = sorted(TOPO.components)
LINKS = sorted(TOPO.links)
KINDS = [
    E.XID,
    E.SXID,
    E.LINK_ERROR,
    E.LINK_DOWN,
    E.LINK_FLAP,
    E.ECC_SBE,
    E.ECC_DBE,
    E.THERMAL,
    E.AER_CORRECTED,
    E.AER_UNCORRECTED,
    E.CHECK_FAILED,
    E.ROW_REMAP_FAILURE,
]


@st.composite
def streams(draw: st.DrawFn, kinds: list[E] = KINDS, codes: list[int] | None = None) -> list[FileEvent]:
    n = draw(st.integers(1, 60))
    out: list[FileEvent] = []
    at = 0.0
    for i in range(n):
        at += draw(st.floats(0, 300))
        link = draw(st.none() | st.sampled_from(LINKS))
        comp = (
            TOPO.links[link].a
            if link is not None and draw(st.booleans())
            else draw(st.sampled_from(COMPONENTS))
        )
        kind = draw(st.sampled_from(kinds))
        code = (
            draw(st.sampled_from(codes or [13, 43, 45, 48, 74, 79, 149, 20034]))
            if kind in (E.XID, E.SXID)
            else None
        )
        out.append(
            FileEvent(
                line=i, time=T0 + timedelta(seconds=at), kind=kind, component=comp, code=code, link=link
            )
        )
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams())
def test_suspects_are_well_formed_and_deterministic(events: list[FileEvent]) -> None:
    runs = []
    for _ in range(2):
        eng = Engine(TOPO, window=timedelta(minutes=30))
        standing: dict[str, VerdictStatus] = {}
        for ev in events:
            for v in eng.observe(ev):
                prev = standing.get(v.suspect.component)
                if v.status is VerdictStatus.NEW:
                    assert prev in (None, VerdictStatus.CLEARED)
                else:
                    assert prev in (VerdictStatus.NEW, VerdictStatus.CHANGED)
                standing[v.suspect.component] = v.status
        ranked = eng.suspects()
        lines = {e.line for e in events}
        for s in ranked:
            assert s.component in TOPO
            assert 0.0 <= s.confidence <= 0.99
            assert set(s.evidence) <= lines
        assert [s.confidence for s in ranked if s.action is not SuspectAction.OBSERVE] == sorted(
            (s.confidence for s in ranked if s.action is not SuspectAction.OBSERVE), reverse=True
        )
        runs.append([(s.component, s.confidence, s.action) for s in ranked])
    assert runs[0] == runs[1]


@settings(max_examples=40, deadline=None)
@given(streams(kinds=[E.XID], codes=[13, 31, 43, 45]))
def test_application_and_collateral_xids_alone_never_make_a_suspect(events: list[FileEvent]) -> None:
    eng = Engine(TOPO)
    assert [v for ev in events for v in eng.observe(ev)] == []
    assert eng.suspects() == []
