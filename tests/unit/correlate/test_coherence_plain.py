"""The coherence statistic's per-event shortcuts leave the same state and verdicts as the plain update.

``Coherence.add`` keeps a candidate with one witness on one symptom as an atomic tuple while the
one-witness screen holds, and runs a score's first screen inline. The plain update below is the code
before those shortcuts: every candidate a :class:`Cand` from its first witness on, every moved
statistic through ``_score``. An engine with each runs over the same generated streams; after every
event the verdicts, the candidates kept, their witnesses, units, supporting symptoms, significance
(and, when significant, ln p and basis) must be equal.
"""

from __future__ import annotations

import math
import types

import pytest
from hypothesis import HealthCheck, given, settings

from gpufleet.correlate import coherence as co
from gpufleet.correlate.engine import Engine
from gpufleet.domain.eventio import FileEvent
from tests.unit.correlate.test_coherence_state import TOPO, weak_streams


def _plain_add(self: co.Coherence, t: float, kind: str, reporter: str, rclass: str, key: tuple[str, str],
               pairs: tuple[tuple[str, str, str, float], ...]) -> list[str]:
    self.note(t, kind, reporter, rclass, key[1])  # the background: not one of the shortcuts
    minute = int(t // co.UNIT_S)
    if t - self._refreshed >= co.REFRESH_S:
        self._refresh(t)
    q_r = self._q.get(rclass, co.PRIOR_Q)
    out: list[str] = []
    hist = self._hist
    me = "self:" + kind
    for c, named, cls, share in pairs:
        lb = q_r * share
        w = me if named == "self" else named
        st = self._cands.get(c)
        if st is None:
            st = self._cands[c] = co.Cand({w: (t, 1, minute, reporter)}, {key: t}, cls, 1, t)
            if co.SCAN * lb >= self._alpha[cls] and c not in hist:
                continue  # one witness, one unit: cannot be significant
            if self._score(c, st, t, lb):
                out.append(self._significant(st, c, t))
            continue
        assert isinstance(st, co.Cand)
        st.keys[key] = t
        wit = st.wit
        old = wit.get(w)
        st.oldest = min(st.oldest, t)
        if old is None or t - old[0] > self.window:
            wit[w] = (t, 1, minute, reporter)
            st.units += 1 if old is None else 1 - old[1]
        elif old[2] != minute:
            units = old[1] + 1
            wit[w] = (t, units, minute, old[3])
            st.units += 1
            if len(wit) == 1 and c not in hist:
                rep = 0.0 if cls in co._SHARED_KINDS else self._log_rep_tail(units - 1, 1)
                if lb > 0.0 and math.log(co.SCAN * lb * (1 - lb / 2)) + rep >= self._log_alpha[cls]:
                    continue
        else:
            wit[w] = (t, old[1], minute, old[3])
            continue
        if self._score(c, st, t, lb):
            out.append(self._significant(st, c, t))
    return out


def _state(coh: co.Coherence) -> dict[str, tuple[object, ...]]:
    out: dict[str, tuple[object, ...]] = {}
    for c, kept in coh._cands.items():
        st = co.cand_of(kept, coh._cls(c)) if isinstance(kept, tuple) else kept
        assert st.oldest <= min(v[0] for v in st.wit.values())
        sig = (st.significant, st.log_p, st.basis) if st.significant else (False,)
        out[c] = (st.wit, st.keys, st.units, st.cls, sig)
    return out


@pytest.mark.patches_internals  # replaces Coherence methods on an object: pure-Python build only
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(weak_streams())
def test_shortcuts_leave_the_state_and_verdicts_of_the_plain_update(events: list[FileEvent]) -> None:
    fast, plain = Engine(TOPO), Engine(TOPO)
    assert fast.coherence is not None and plain.coherence is not None
    plain.coherence.add = types.MethodType(_plain_add, plain.coherence)  # type: ignore[method-assign]
    for ev in events:
        assert fast.observe(ev) == plain.observe(ev)
        assert _state(fast.coherence) == _state(plain.coherence)
    assert fast.suspects() == plain.suspects()
