"""Evidence from coherence: how surprising is the *set* of reporters that share one candidate?

Every symptom event (and every non-fatal SXID, which the catalog rates informational) makes its
reporter a *witness* for each of the symptom's candidates: for a switch, the distinct far unit (tray,
node) or, inside one HGX node, the distinct GPU; for a replaceable unit, the distinct component inside
it; for a cable, the end that reported; for a component reporting about itself, one witness per kind
of event it reports (``self:link_error``, ``self:aer_corrected``: a NIC with symbol errors *and*
corrected AERs is two coincidences). Within the coherence ``window`` a candidate ``c`` has ``k``
distinct witnesses and ``u`` *units* (distinct witness-minutes: a burst counts once, errors that recur
minute after minute count again).

Background model (the null): each component of class ``r`` (GPU, NIC, NVSwitch, leaf, ...) reports
weak events in a window with probability ``q[r]``, independently; a report names one of its ``deg``
links at random. So the number of witnesses ``c`` collects by chance is about Poisson with mean
``mu(c) = sum_r E(c, r) * q[r]``, where the *exposure* ``E(c, r)`` counts the reporters that can name
``c`` (a reporter inside ``c`` or ``c`` itself counts 1, a far end ``1/deg``). A background witness's
minutes beyond its first (its *excess*) are negative binomial with the mean and variance of the
stream's active reporters (Poisson when the variance is not above the mean). The surprise is

    p(c) = min(P(Poisson(mu) >= k), 2 P(Poisson(mu_s) >= k_s)) * P(excess of k witnesses >= u - k) * SCAN

with ``k_s`` the witnesses active in the last third of the window and ``mu_s = mu (W/3 + d)/(W + d)``
(``d`` the background's mean activity span: a reporter is active for an interval, not an instant).
``SCAN`` = 3 pays for looking at several statistics; a cable's two ends are computed exactly; for a
switch or unit only ``k`` counts (repetition is evidence about what a witness reports on).
``c`` is *significant* when ``p(c) <= alpha(c)``, the share of the false-alarm budget (default 1 false
verdict per 1,000 node-days) that falls on one candidate of its kind in one window:
``budget * nodes * window / 1 day / (kinds * candidates of the kind)``.

Moves: when a unit leaves a slot, the pattern there (its ``p``) is kept for ``rate_window`` as
evidence that *stays* with the slot and *follows* the unit (:meth:`Coherence.moved`). A later pattern
at either place is combined with it by Fisher's method and tested against the budget share split over
the few kept patterns of its class (not over every candidate: only moved units are tried).

Rates are learned from the stream: ``q[(kind, r)]`` is the fraction of class-``r`` components that
reported event kind ``kind`` in the last ``rate_window`` (reporters explained by a significant
candidate left out, so a fault in progress does not raise its own background), shrunk towards the
cold-start prior ``PRIOR_Q`` with ``PRIOR_WEIGHT`` component-windows; ``q[r]`` sums over kinds. The
excess's mean and variance likewise (prior Poisson(0.5)). Rates are refreshed once a minute of stream
time. docs/correlate.md §Weak signals has the model on an example.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.correlate.tails import log_negbin_tail as _log_negbin_tail
from gpufleet.correlate.tails import log_poisson_tail as _log_poisson_tail
from gpufleet.domain.topology import Topology

PRIOR_Q = 0.01  # per component, per kind, per window: a corrected-error report (our assumption)
PRIOR_WEIGHT = 50.0  # component-windows the prior is worth
# Repetition: a background witness's minutes beyond its first (its *excess*) are negative binomial with
# mean and variance learned from the stream's active reporters, shrunk to a Poisson(0.5) prior worth
# PRIOR_REP_WEIGHT reporters (variance <= mean: Poisson).
PRIOR_EXCESS, PRIOR_REP_WEIGHT = 0.5, 20.0
SCAN = 3.0
SHORT = 3.0  # the short scale is window / SHORT
_LN2 = math.log(2.0)
UNIT_S = 60.0
REFRESH_S = 60.0
_DAY = 86400.0
FOLLOWS, STAYS = "follows", "stays"
_SELF: dict[str, str] = {}
_SHARED_KINDS = frozenset({"nvswitch", "leaf_switch", "spine_switch", "core_switch", "node", "compute_tray",
                           "switch_tray"})
_EXPOSURE_CACHE = 200_000  # candidates whose exposure is kept (a pure function of the topology)
# Exposures are a pure function of the topology: engines over the same topology share them.
# (the topology, exposures by candidate, components and links per class)
_SHARED: dict[int, tuple[Topology, dict[str, dict[str, float]], dict[str, int]]] = {}


def _class_sizes(topology: Topology) -> dict[str, int]:
    counts: dict[str, int] = {}
    for comp in topology.components.values():
        k = comp.kind.value
        counts[k] = counts.get(k, 0) + 1
    for ln in topology.links.values():
        counts[ln.kind] = counts.get(ln.kind, 0) + 1
    return counts


@dataclass(slots=True)
class _Cand:
    wit: dict[str, tuple[float, int, int]]  # witness -> (last time, units, last minute)
    keys: dict[tuple[str, str], float]  # supporting symptoms -> last time
    reporters: dict[str, str]  # witness -> a reporter behind it (rates leave explained reporters out)
    cls: str = ""
    significant: bool = False
    log_p: float = 0.0
    basis: str = ""  # FOLLOWS / STAYS: significant with the pattern kept from before a move


class Coherence:
    """Distinct-witness scan statistic per candidate against a learned Poisson background."""

    def __init__(
        self,
        topology: Topology,
        kind_of: Callable[[str], str],
        *,
        window_s: float = 900.0,
        rate_window_s: float = 7200.0,
        budget_per_node_day: float = 1e-3,
    ) -> None:
        self._topo = topology
        self._kind_of = kind_of
        self.window = window_s
        self._rate_window = rate_window_s
        shared = _SHARED.get(id(topology))
        if shared is None or shared[0] is not topology:
            if len(_SHARED) >= 4:
                _SHARED.pop(next(iter(_SHARED)))
            shared = _SHARED[id(topology)] = (topology, {}, _class_sizes(topology))
        self._exposure = shared[1]
        self._class_size = counts = shared[2]
        nodes = counts.get("node", 0) + counts.get("compute_tray", 0)
        share = budget_per_node_day * max(1, nodes) * window_s / _DAY / max(1, len(counts) - 1)
        self._log_alpha = {k: math.log(share / n) for k, n in counts.items()}
        self._log_share = math.log(share)
        self._alpha = {k: share / n for k, n in counts.items()}
        self._cands: dict[str, _Cand] = {}
        self._deg: dict[str, int] = {}
        self._seen: dict[tuple[str, str], dict[str, tuple[float, int, int]]] = {}  # (kind, class) -> reporter
        self._hist: dict[str, dict[str, tuple[float, float]]] = {}  # candidate -> basis -> (move time, ln p)
        self._log_alpha_hist: dict[str, float] = {}  # per class: the share over the kept patterns of the class
        self._explained: dict[str, float] = {}  # reporter -> until when it is left out of the rates
        self._q: dict[str, float] = {}
        self._rep = (PRIOR_EXCESS, math.inf)  # (mean excess per witness, negative-binomial size; inf: Poisson)
        self._start = math.inf
        self._refreshed = -math.inf
        self._swept = -math.inf

    # -- input --------------------------------------------------------------------------------------------

    def add(self, t: float, kind: str, reporter: str, rclass: str, key: tuple[str, str],
            pairs: tuple[tuple[str, str, str, bool], ...]) -> list[str]:
        """One event of ``kind`` from ``reporter`` (class ``rclass``) on symptom ``key`` whose
        candidates and witnesses are ``pairs``; returns the candidates that are significant after
        this event moved their statistic (a new witness or witness-minute)."""
        self._start = min(self._start, t)
        minute = int(t // UNIT_S)
        seen = self._seen.get((kind, rclass))
        if seen is None:
            seen = self._seen[(kind, rclass)] = {}
        prev = seen.get(reporter)
        if prev is None:
            seen[reporter] = (t, 1, minute)
        elif prev[2] != minute:
            seen[reporter] = (t, prev[1] + 1, minute)
        if t - self._refreshed >= REFRESH_S:
            self._refresh(t)
        q_r = self._q.get(rclass, PRIOR_Q)
        deg = self._deg.get(reporter)
        if deg is None:
            deg = self._deg[reporter] = max(1, len(self._topo.links_of(reporter)))
        out: list[str] = []
        alpha = self._alpha
        cands = self._cands
        me = _SELF.get(kind) or _SELF.setdefault(kind, "self:" + kind)
        for c, named, cls, inside in pairs:
            lb = q_r if inside else q_r / deg  # this reporter's own share of mu(c)
            w = me if named == "self" else named  # about itself: one witness per kind of event it reports
            st = cands.get(c)
            if st is None:
                st = cands[c] = _Cand({w: (t, 1, minute)}, {key: t}, {w: reporter}, cls)
                if SCAN * lb >= alpha[cls] and c not in self._hist:
                    continue  # one witness, one unit: p >= SCAN * (1 - e^-lb), cannot be significant
                if self._score(c, st, t, lb):
                    out.append(self._significant(st, c, t))
                continue
            st.keys[key] = t
            old = st.wit.get(w)
            if old is None or t - old[0] > self.window:
                st.wit[w] = (t, 1, minute)
                st.reporters[w] = reporter
            elif old[2] != minute:
                st.wit[w] = old = (t, old[1] + 1, minute)
                rep = 0.0 if cls in _SHARED_KINDS else self._log_rep_tail(old[1] - 1, 1)
                if (len(st.wit) == 1 and math.log(SCAN * lb * (1 - lb / 2)) + rep >= math.log(alpha[cls])
                        and c not in self._hist):
                    continue  # one witness: p >= SCAN * P(it speaks) * P(excess >= units-1), not significant
            else:
                st.wit[w] = (t, old[1], minute)
                continue  # same witness, same minute: the statistic did not move
            if self._score(c, st, t, lb):
                out.append(self._significant(st, c, t))
        return out

    def _significant(self, st: _Cand, c: str, t: float) -> str:
        st.significant = True  # (again): a new witness of a significant pattern joins it
        for r in st.reporters.values():
            self._explained[r] = t + self._rate_window
        return c

    def pair(self, c: str, w: str, reporter: str) -> tuple[str, str, str, bool]:
        """(candidate, witness, candidate class, reporter inside the candidate) for :meth:`add`."""
        inside = w == "self" or (w == reporter and c not in self._topo.links)
        return (c, w, self._cls(c), inside)

    def support(self, c: str, now: float) -> list[tuple[str, str]]:
        """Symptom keys behind ``c``'s witnesses within the window."""
        st = self._cands.get(c)
        if st is None:
            return []
        return [k for k, t in st.keys.items() if now - t <= self.window]

    def surprise(self, c: str) -> float:
        """``log10(alpha / p)`` of ``c`` at its last scoring (> 0: significant); 0 when unknown."""
        st = self._cands.get(c)
        if st is None:
            return 0.0
        return (self._log_alpha[self._cls(c)] - st.log_p) / math.log(10)

    def _cls(self, c: str) -> str:
        kind = self._kind_of(c)
        return self._topo.links[c].kind if kind == "link" else kind

    def is_significant(self, c: str) -> bool:
        st = self._cands.get(c)
        return st is not None and st.significant

    def moved(self, from_slot: str, to_slot: str, t: float) -> None:
        """A unit left ``from_slot`` for ``to_slot``. The weak pattern seen at the old slot (the slot
        itself, what is inside it, the cables on it) is kept for ``rate_window`` twice: as evidence
        that *stays* with the slot (its cabling, its connector) and, for the unit and what it carries,
        as evidence that *follows* it to the same relative place under ``to_slot``. The live patterns
        there start afresh: the occupant changed. A later pattern at either place is combined with
        the kept one (:meth:`_score`)."""
        topo = self._topo
        inside = {from_slot, *topo.descendants(from_slot)}
        links = topo.links
        hist = self._hist
        for c in list(self._cands):
            ln = links.get(c)
            if not (c in inside or (ln is not None and (ln.a in inside or ln.b in inside))):
                continue
            st = self._cands.pop(c)
            lp = self._log_p(c, st, t)
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
        move (:meth:`moved`); else ``""``."""
        st = self._cands.get(c)
        return st.basis if st is not None and st.significant else ""

    # -- the statistic ------------------------------------------------------------------------------------

    def _score(self, c: str, st: _Cand, t: float, mu_lb: float) -> bool:
        hist = self._hist.get(c) if self._hist else None
        if hist:
            return self._score_with_history(c, st, t, hist)
        cutoff = t - self.window
        wit = st.wit
        if any(v[0] < cutoff for v in wit.values()):
            for w in [w for w, v in wit.items() if v[0] < cutoff]:
                del wit[w]
                st.reporters.pop(w, None)
        k = len(wit)
        units = sum(v[1] for v in wit.values())
        log_alpha = self._log_alpha[st.cls]
        # Repetition (units beyond one per witness) is evidence about the thing a witness reports
        # on — its cable, itself — not about a switch or unit it shares with others: a flapping
        # cable's 12 minutes must not make its leaf surprising. Shared parts use k alone.
        tail_u = math.log(SCAN)
        if st.cls not in _SHARED_KINDS:
            tail_u += self._log_rep_tail(units - k, k)
        ln = self._topo.links.get(c)
        if ln is None and _log_poisson_tail(k, mu_lb) + tail_u > log_alpha:
            # Screen: mu >= mu_lb (this reporter's own share of the exposure) and the tail grows
            # with mu, so even the smallest possible background leaves the pattern unsurprising.
            # Spares most noise events the exposure (a walk over the candidate's links).
            st.log_p = _log_poisson_tail(k, mu_lb) + tail_u
            st.significant = False
            return False
        if ln is not None:  # two possible witnesses with unequal odds: the exact tail, not Poisson
            pa, pb = self._p_end(ln.a), self._p_end(ln.b)
            tail = pa * pb if k >= 2 else 1.0 - (1.0 - pa) * (1.0 - pb) if k == 1 else 1.0
            log_k = math.log(max(tail, 1e-300))
        else:
            mu = self.mu(c)
            log_k = _log_poisson_tail(k, mu)
            # A second, shorter scale: the witnesses active in the last third of the window (a
            # fault's witnesses come closer together than the background's). A background reporter
            # is active for an interval, not an instant (about its mean excess minutes), so the
            # share of ``mu`` that falls in the short scale is (W/3 + d) / (W + d). The better of the
            # two scales pays a factor 2 for the choice.
            short_s = self.window / SHORT
            k_s = sum(1 for v in wit.values() if v[0] >= t - short_s)
            if k_s >= 2:
                d = self._rep[0] * UNIT_S
                log_k = min(log_k, _log_poisson_tail(k_s, mu * (short_s + d) / (self.window + d))) + _LN2
        st.log_p = log_k + tail_u
        st.basis = ""
        sig = st.log_p <= log_alpha
        if not sig:
            st.significant = False
        return sig

    def _log_p(self, c: str, st: _Cand, t: float) -> float:
        """ln p of ``c``'s witnesses now, without the screens."""
        self._score(c, st, t, 0.0)
        return st.log_p

    def _score_with_history(self, c: str, st: _Cand, t: float, hist: dict[str, tuple[float, float]]) -> bool:
        """``c``'s pattern now, alone or combined with one kept from before a move (Fisher's method
        for two independent p-values, ``x (1 - ln x)`` with ``x`` their product, and a factor 2 for
        trying both the slot's and the unit's history)."""
        self._hist[c] = {}  # the live pattern alone first, against the class's threshold
        try:
            if self._score(c, st, t, 0.0):
                return True
        finally:
            self._hist[c] = hist
        # The combined test is tried only on the few candidates a move left a pattern for: its share
        # of the budget is split over those (per class), not over every candidate of the class.
        alone = st.log_p
        log_alpha = self._log_alpha_hist.get(st.cls, self._log_share)
        sig = False
        for basis, (th, lp) in hist.items():
            if t - th > self._rate_window:
                continue
            x = alone + lp
            comb = x + math.log1p(-x) + math.log(2.0)
            if comb <= log_alpha and (not sig or comb < st.log_p):
                st.log_p, st.basis, sig = comb, basis, True
        if not sig:
            st.significant = False
        return sig

    def _log_rep_tail(self, e: int, k: int) -> float:
        """ln P(the excess minutes of ``k`` background witnesses sum to ``e`` or more)."""
        m, size = self._rep
        if size == math.inf:
            return _log_poisson_tail(e, k * m)
        return _log_negbin_tail(e, k * size, size / (size + m))

    def _p_end(self, r: str) -> float:
        """Probability that end ``r`` of a cable reports on that cable in one window."""
        return min(1.0, self._q.get(self._kind_of(r), PRIOR_Q) / max(1, len(self._topo.links_of(r))))

    def mu(self, c: str) -> float:
        """Expected number of witnesses of ``c`` in one window under the background."""
        exp = self._exposure.get(c)
        if exp is None:
            exp = self._exposure[c] = self._expose(c)
            if len(self._exposure) > _EXPOSURE_CACHE:
                self._exposure.pop(next(iter(self._exposure)))
        q = self._q
        return sum(e * q.get(r, PRIOR_Q) for r, e in exp.items())

    def _expose(self, c: str) -> dict[str, float]:
        topo = self._topo
        out: dict[str, float] = {}

        def far(r: str) -> None:
            cls = self._kind_of(r)
            out[cls] = out.get(cls, 0.0) + 1.0 / max(1, len(topo.links_of(r)))

        if c in topo.links:
            ln = topo.links[c]
            far(ln.a)
            far(ln.b)
            return out
        inside = {c, *topo.descendants(c)}
        for m in inside:
            cls = self._kind_of(m)
            out[cls] = out.get(cls, 0.0) + 1.0
            for lid in topo.links_of(m):
                other = topo.links[lid].other(m)
                if other not in inside:
                    far(other)
        return out

    def _refresh(self, t: float) -> None:
        """Re-learn the background rates from the last ``rate_window`` of the stream."""
        self._refreshed = t
        cutoff = t - self._rate_window
        span = max(self.window, min(self._rate_window, t - self._start))
        windows = span / self.window
        if self._explained and t - self._swept >= self._rate_window:
            self._explained = {r: u for r, u in self._explained.items() if u > t}
        explained = self._explained
        per_class: dict[str, float] = {}
        active = excess = excess2 = 0
        for (_, cls), seen in self._seen.items():
            stale = [r for r, v in seen.items() if v[0] < cutoff]
            for r in stale:
                del seen[r]
            n = 0
            for r, v in seen.items():
                if explained.get(r, -math.inf) > t:
                    continue
                n += 1
                active += 1
                excess += v[1] - 1
                excess2 += (v[1] - 1) ** 2
            size = self._class_size.get(cls, 1)
            rate = (PRIOR_Q * PRIOR_WEIGHT + n / windows) / (PRIOR_WEIGHT + size)
            per_class[cls] = per_class.get(cls, 0.0) + rate
        self._q = per_class
        w = PRIOR_REP_WEIGHT
        m = (PRIOR_EXCESS * w + excess) / (w + active)
        var = (PRIOR_EXCESS * (1 + PRIOR_EXCESS) * w + excess2) / (w + active) - m * m
        self._rep = (m, m * m / (var - m) if var > m * 1.001 else math.inf)
        if t - self._swept >= self.window:
            self._swept = t
            for c in [c for c, st in self._cands.items() if all(v[0] < t - self.window for v in st.wit.values())]:
                del self._cands[c]
