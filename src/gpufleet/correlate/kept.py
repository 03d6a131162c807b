"""Weak patterns kept across moves: the coherence statistic's memory of what a slot showed before its
unit left (:class:`KeptPatterns`, the base of :class:`gpufleet.correlate.coherence.Coherence`).

When a unit leaves a slot, the pattern there (its ln p) is kept for ``rate_window`` twice: as evidence
that *stays* with the slot (its cabling, its connector) and, for the unit and what it carries, as
evidence that *follows* it to the same relative place under its new slot. A later pattern at either
place is combined with the kept one by Fisher's method for two independent p-values and tested against
the false-alarm budget's share split over the few kept patterns of its class (only moved units are
tried, not every candidate): a weak pattern seen at the old slot and again at the new one is strong
evidence for the unit (or, again at the old slot under a new unit, for the slot). docs/correlate.md
§Moves amplify weak evidence.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from gpufleet.correlate.candidates import Cand, Once, cand_of
from gpufleet.domain.topology import Link, Topology

FOLLOWS, STAYS = "follows", "stays"
_LN2 = math.log(2.0)


class KeptPatterns:
    """Patterns kept from before a move and their combination with a live one (the base of
    ``Coherence``, which sets every attribute declared here and scores the live patterns)."""

    _topo: Topology
    _kind_of: Callable[[str], str]
    _links: Mapping[str, Link]
    _cands: dict[str, Cand | Once]
    _rate_window: float
    _log_share: float  # ln of one candidate class's share of the false-alarm budget per window
    _hist: dict[str, dict[str, tuple[float, float]]]  # candidate -> basis -> (move time, ln p)
    _log_alpha_hist: dict[str, float]  # per class: the share over the kept patterns of the class

    def _cls(self, c: str) -> str:
        """``c``'s candidate class: its kind, or its link's kind for a cable."""
        kind = self._kind_of(c)
        return self._topo.links[c].kind if kind == "link" else kind

    def _keep_left(self, from_slot: str, to_slot: str, t: float,
                   live_log_p: Callable[[str, Cand, float], float]) -> None:
        """Keep the patterns at ``from_slot`` (each candidate's ln p now, by ``live_log_p``) as staying
        there and following its unit to ``to_slot`` (``Coherence.moved``)."""
        topo = self._topo
        inside = {from_slot, *topo.descendants(from_slot)}
        links = topo.links
        hist = self._hist
        for c in list(self._cands):
            ln = links.get(c)
            if not (c in inside or (ln is not None and (ln.a in inside or ln.b in inside))):
                continue
            st = self._cands.pop(c)
            lp = live_log_p(c, cand_of(st, self._cls(c)) if isinstance(st, tuple) else st, t)
            if lp >= 0.0:
                continue  # nothing there but the background
            self._keep(c, STAYS, t, lp)
            if ln is None and c.startswith(from_slot):
                dest = to_slot + c[len(from_slot):]
                if dest in topo.components:
                    self._keep(dest, FOLLOWS, t, lp)
        self._hist = hist = {c: h for c, h in hist.items() if any(t - v[0] <= self._rate_window for v in h.values())}
        fam: dict[str, int] = {}
        for c, h in hist.items():
            cls = self._cls(c)
            fam[cls] = fam.get(cls, 0) + len(h)
        self._log_alpha_hist = {cls: self._log_share - math.log(n) for cls, n in fam.items()}

    def _keep(self, c: str, basis: str, t: float, lp: float) -> None:
        h = self._hist.setdefault(c, {})
        old = h.get(basis)
        if old is None or t - old[0] > self._rate_window or lp < old[1]:
            h[basis] = (t, lp)

    def basis(self, c: str) -> str:
        """``follows`` / ``stays`` when ``c`` is significant only with the pattern kept from before a
        move (``Coherence.moved``); else ``""``."""
        st = self._cands.get(c)
        return st.basis if isinstance(st, Cand) and st.significant else ""

    def _combined(self, st: Cand, t: float, hist: dict[str, tuple[float, float]]) -> bool:
        """A live pattern not significant alone (``st.log_p``, as ``Coherence._score_live`` left it),
        combined with one kept from before a move (Fisher's method for two independent p-values,
        ``x (1 - ln x)`` with ``x`` their product, and a factor 2 for trying both the slot's and the
        unit's history): whether that is significant (``st.log_p`` and ``st.basis`` then say how)."""
        # The combined test is tried only on the few candidates a move left a pattern for: its share
        # of the budget is split over those (per class), not over every candidate of the class.
        alone = st.log_p
        log_alpha = self._log_alpha_hist.get(st.cls, self._log_share)
        sig = False
        for basis, (th, lp) in hist.items():
            if t - th > self._rate_window:
                continue
            # ln of the product, at most 0: the live ln p can exceed 0 (SCAN times a tail of 1 when the
            # window is empty: ln 3), and Fisher's x (1 - ln x) needs x <= 1. Clamped, such a pair is
            # never significant, as it was not before (where it did not raise).
            x = min(alone + lp, 0.0)
            comb = x + math.log1p(-x) + _LN2
            if comb <= log_alpha and (not sig or comb < st.log_p):
                st.log_p, st.basis, sig = comb, basis, True
        if not sig:
            st.significant = False
        return sig
