"""The rate window's reporters (:class:`gpufleet.correlate.rates.Reporters`) equal a plain recomputation.

Entries that find who left go to a queue in time order and, when they come out of order (late
events), to a heap. After any sequence of sightings, in or out of order, and any cutoffs, the
reporters kept and their sums must be what a plain scan of the last sightings gives.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.correlate.rates import Reporters

steps = st.lists(
    st.one_of(
        st.tuples(st.just("saw"), st.sampled_from("abcdefgh"), st.floats(-900, 600)),  # time step (back too)
        st.tuples(st.just("forget"), st.just(""), st.floats(0, 9000)),  # cutoff this far behind now
    ),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(steps)
def test_reporters_equal_the_plain_scan(ops: list[tuple[str, str, float]]) -> None:
    rs = Reporters()
    plain: dict[str, tuple[float, int, int]] = {}
    now = 0.0
    for op, r, x in ops:
        if op == "saw":
            now = max(0.0, now + x)
            minute = int(now // 60)
            prev = rs.last.get(r)
            if prev is None or prev[2] != minute:
                rs.saw(r, now, minute, prev)
                plain[r] = (now, 1 if prev is None else prev[1] + 1, minute)
        else:
            cutoff = now - x
            rs.forget_before(cutoff)
            plain = {k: v for k, v in plain.items() if v[0] >= cutoff}
        assert rs.last == plain
        assert rs.n == len(plain)
        assert rs.excess == sum(v[1] - 1 for v in plain.values())
        assert rs.excess2 == sum((v[1] - 1) ** 2 for v in plain.values())
        assert list(rs.queue) == sorted(rs.queue, key=lambda e: e[0])
