"""Repeat offenders by serial (issue #14 item 5): the unit, not the slot, and episodes, not re-emits."""

from __future__ import annotations

from datetime import timedelta

from gpufleet.correlate.engine import Engine
from gpufleet.correlate.model import Suspect, SuspectAction, VerdictStatus
from gpufleet.correlate.offenders import REPEAT_GAP, MemoryHistory, Naming, earlier_episodes
from gpufleet.domain.events import EventKind as E
from gpufleet.domain.topology_gen import generate_hgx
from tests.unit.correlate.helpers import T0, Stream

TOPO = generate_hgx(16)
A, B = "r01-n02-gpu3", "r03-n01-gpu5"
DAY = 86400.0


def _n(hours: float, slot: str = A) -> Naming:
    return Naming("SN", slot, "gpu", T0 + timedelta(hours=hours))


def test_namings_closer_than_the_gap_are_one_episode_and_recent_ones_do_not_count() -> None:
    now = T0 + timedelta(days=10)
    got = earlier_episodes([_n(0), _n(1), _n(2), _n(48), _n(49), _n(240 - 1)], now)
    assert got == [_n(0), _n(48)]  # two episodes; the naming an hour ago is this episode
    assert earlier_episodes([], now) == []
    assert earlier_episodes([_n(0)], T0 + REPEAT_GAP - timedelta(seconds=1)) == []


def test_memory_history_keeps_each_naming_once_in_time_order() -> None:
    h = MemoryHistory()
    for n in (_n(5), _n(1), _n(5)):
        h.record(n)
    assert h.named("SN", T0) == [_n(1), _n(5)]
    assert h.named("SN", T0 + timedelta(hours=2)) == [_n(5)]


def _new(eng: Engine, s: Stream) -> dict[str, Suspect]:
    out: dict[str, Suspect] = {}
    for ev in s.events:
        for v in eng.observe(ev):
            if v.status is VerdictStatus.NEW:
                out[v.suspect.component] = v.suspect
    return out


def test_a_unit_named_again_in_another_slot_days_later_is_a_repeat_offender() -> None:
    s = Stream()
    serial, other = TOPO.components[A].serial, TOPO.components[B].serial
    s.add(10, E.XID, A, code=79)
    s.add(DAY, E.MOVED, serial=serial, src=A, dst=B)  # repaired, reseated in another node
    s.add(DAY + 30, E.MOVED, serial=other, src=B, dst=A)
    s.add(3 * DAY, E.XID, B, code=79)
    s.add(4 * DAY, E.XID, A, code=79)  # the other unit, in the first slot: not a repeat
    history = MemoryHistory()
    eng = Engine(TOPO, history=history)
    new = _new(eng, s)
    first = eng.history.named(serial or "", T0)
    assert [n.component for n in first] == [A, B]
    rep = new[B]
    assert rep.serial == serial and rep.repeats == 1
    assert rep.action is SuspectAction.DRAIN_AND_REPLACE and "repeat offender" in rep.reason
    assert new[A].repeats == 0 and new[A].serial == other


def test_a_verdict_that_clears_and_returns_within_the_gap_is_one_episode() -> None:
    s = Stream()
    s.add(10, E.XID, A, code=79)
    s.add(3 * 3600, E.XID, A, code=79)  # the first verdict aged out of the window; same episode
    new_first = _new(Engine(TOPO), s)
    assert new_first[A].repeats == 0
