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
evidence that *stays* with the slot and *follows* the unit (:meth:`Coherence.moved`; the kept patterns are
this class's base, :mod:`gpufleet.correlate.kept`). A later pattern
at either place is combined with it by Fisher's method and tested against the budget share split over
the few kept patterns of its class (not over every candidate: only moved units are tried).

Rates (``q[r]``, the excess's mean and variance) are learned from the last ``rate_window`` of the
stream and refreshed once a minute of stream time (:mod:`gpufleet.correlate.rates`). The per-event
work is kept small without changing a number (docs/correlate.md §Cost per event with coherence on);
docs/correlate.md §Weak signals has the model on an example.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from gpufleet.correlate.candidates import Cand, cand_of, prune
from gpufleet.correlate.explain import UNITS as _UNIT_KINDS  # what contains other candidates
from gpufleet.correlate.index import Pairs, index_of
from gpufleet.correlate.kept import KeptPatterns
from gpufleet.correlate.model import SymptomKey
from gpufleet.correlate.rates import PRIOR_EXCESS, PRIOR_Q, Reporters, learn
from gpufleet.correlate.tails import log_negbin_tail as _log_negbin_tail
from gpufleet.correlate.tails import log_poisson_tail as _log_poisson_tail
from gpufleet.domain.false_alarms import FALSE_ALARM_BUDGET, false_alarm_budget
from gpufleet.domain.topology import Topology

SCAN = 3.0
SHORT = 3.0  # the short scale is window / SHORT
_LN2 = math.log(2.0)
_LN10 = math.log(10.0)
_LOG_SCAN = math.log(SCAN)
UNIT_S = 60.0
REFRESH_S = 60.0
_DAY = 86400.0
_SELF: dict[str, str] = {}
# A unit whose pattern is significant through one significant part inside it keeps its own standing
# only if the rest of its witnesses would come from the background in fewer than 1 window in 20
# (explained_away). On the tune split 0.05-0.1 did alike; 0.01 lost an HGX node, 0.3 three degrading chips.
RESIDUAL_P = 0.05
_LOG_RESIDUAL = math.log(RESIDUAL_P)
_SHARED_KINDS = frozenset({"nvswitch", "leaf_switch", "spine_switch", "core_switch", "node", "compute_tray",
                           "switch_tray"})


class Coherence(KeptPatterns):
    """Distinct-witness scan statistic per candidate against a learned Poisson background."""

    def __init__(
        self,
        topology: Topology,
        kind_of: Callable[[str], str],
        *,
        window_s: float = 900.0,
        rate_window_s: float = 7200.0,
        budget_per_node_day: float = FALSE_ALARM_BUDGET,
    ) -> None:
        false_alarm_budget(budget_per_node_day, "false_alarm_budget")
        self._topo = topology
        self._kind_of = kind_of
        self.window = window_s
        self._rate_window = rate_window_s
        self._index = idx = index_of(topology)  # exposures etc.: shared by engines on the same topology
        self._links = topology.links
        self._class_size = counts = idx.class_size
        self._cables = idx.link_classes
        nodes = counts.get("node", 0) + counts.get("compute_tray", 0)
        share = budget_per_node_day * max(1, nodes) * window_s / _DAY / max(1, len(counts) - 1)
        self._alpha = {k: share / n for k, n in counts.items()}
        self._log_alpha = {k: math.log(a) for k, a in self._alpha.items()}
        self._log_share = math.log(share)
        self._cands = {}  # candidate -> its witnesses and symptoms (candidates.py)
        self._seen: dict[tuple[str, str], Reporters] = {}  # (kind, class) -> its reporters in the rate window
        # the same, of reports naming a link by components with one link (a NIC): _p_end
        self._seen_link: dict[tuple[str, str], Reporters] = {}
        self._q_link: dict[str, float] = {}
        self._hist = {}  # patterns kept from before a move (kept.py)
        self._log_alpha_hist = {}
        self._explained: dict[str, float] = {}  # reporter -> until when it is left out of the rates
        self._q: dict[str, float] = {}
        self._rep = (PRIOR_EXCESS, math.inf)  # (mean excess per witness, negative-binomial size; inf: Poisson)
        self._start = math.inf
        self._refreshed = -math.inf
        self._swept = -math.inf
        # Tail probabilities by their arguments, forgotten when the rates change (pure functions of
        # (k, mu) and of (excess, k) under the current repetition model: the same floats either way).
        self._poisson_memo: dict[tuple[int, float], float] = {}
        self._rep_memo: dict[tuple[int, int], float] = {}

    # -- input --------------------------------------------------------------------------------------------

    @property
    def rate_window(self) -> float:
        """Seconds of stream the background rates are learned from."""
        return self._rate_window

    def learned_since(self, t: float) -> None:
        """The stream about to be :meth:`note`-d begins at ``t`` (its first event may come later)."""
        self._start = min(self._start, t)

    def note(self, t: float, kind: str, reporter: str, rclass: str, link: str = "") -> None:
        """Learn one event of the background only (what :meth:`add` does first): a restart primes the
        rates with the stream before its replay, so the replay tests against the background the engine
        had learned, not a cold start's (``Engine.prime``). ``link``: the link the event names, if any."""
        self._start = min(self._start, t)
        minute = int(t // UNIT_S)
        _saw(self._seen, kind, rclass, reporter, t, minute)
        if link and (self._index.degree.get(reporter) or self._index.deg(reporter)) == 1:
            ln = self._links.get(link)
            if ln is not None and reporter in (ln.a, ln.b):  # a one-link end about its own link
                _saw(self._seen_link, kind, rclass, reporter, t, minute)

    def add(self, t: float, kind: str, reporter: str, rclass: str, key: SymptomKey,
            pairs: Pairs) -> list[str]:
        """One event of ``kind`` from ``reporter`` (class ``rclass``) on symptom ``key`` whose
        candidates and witnesses are ``pairs``; returns the candidates that are significant after
        this event moved their statistic (a new witness or witness-minute)."""
        self.note(t, kind, reporter, rclass, key[1])
        minute = int(t // UNIT_S)
        if t - self._refreshed >= REFRESH_S:
            self._refresh(t)
        q_r = self._q.get(rclass, PRIOR_Q)
        out: list[str] = []
        alpha = self._alpha
        log_alpha = self._log_alpha  # = ln alpha, as computed from it
        cands = self._cands
        hist = self._hist
        window = self.window
        me = _SELF.get(kind) or _SELF.setdefault(kind, "self:" + kind)
        cables = self._cables
        memo = self._poisson_memo
        for c, named, cls, share in pairs:
            lb = q_r * share  # this reporter's own share of mu(c): a lower bound of it (own_share)
            w = me if named == "self" else named  # about itself: one witness per kind of event it reports
            st = cands.get(c)
            if st is None:
                if SCAN * lb >= alpha[cls] and c not in hist:
                    cands[c] = (t, minute, w, reporter, key, 1)
                    continue  # one witness, one unit: p >= SCAN * (1 - e^-lb), cannot be significant
                st = cands[c] = Cand({w: (t, 1, minute, reporter)}, {key: t}, cls, 1, t)
                if self._score(c, st, t, lb):
                    out.append(self._significant(st, c, t))
                continue
            if isinstance(st, tuple):
                # The same witness on the same symptom within the window: as the Cand path below
                # does it (a new time, or a new minute behind the one-witness screen), kept a tuple.
                if st[2] == w and st[4] == key and t - st[0] <= window and c not in hist:
                    if st[1] == minute:
                        cands[c] = (t, minute, w, st[3], key, st[5])
                        continue
                    units = st[5] + 1
                    rep = 0.0 if cls in _SHARED_KINDS else self._log_rep_tail(units - 1, 1)
                    if lb > 0.0 and math.log(SCAN * lb * (1 - lb / 2)) + rep >= log_alpha[cls]:
                        cands[c] = (t, minute, w, st[3], key, units)
                        continue
                st = cands[c] = cand_of(st, cls)
            st.keys[key] = t
            wit = st.wit
            old = wit.get(w)
            st.oldest = min(st.oldest, t)
            if old is None or t - old[0] > window:
                wit[w] = (t, 1, minute, reporter)
                st.units += 1 if old is None else 1 - old[1]
            elif old[2] != minute:
                units = old[1] + 1
                wit[w] = (t, units, minute, old[3])
                st.units += 1
                if len(wit) == 1 and c not in hist:
                    rep = 0.0 if cls in _SHARED_KINDS else self._log_rep_tail(units - 1, 1)
                    if lb > 0.0 and math.log(SCAN * lb * (1 - lb / 2)) + rep >= log_alpha[cls]:
                        continue  # one witness: p >= SCAN * P(it speaks) * P(excess >= units-1), not significant
            else:
                wit[w] = (t, old[1], minute, old[3])
                continue  # same witness, same minute: the statistic did not move
            if cls not in cables and not (hist and c in hist):
                # _score's first screen, inline (most scores end here; tail_u as _tail): the same numbers and state.
                if st.oldest < t - window:
                    prune(st, t - window)
                k = len(wit)
                tail_u = _LOG_SCAN if cls in _SHARED_KINDS else _LOG_SCAN + self._log_rep_tail(st.units - k, k)
                lp = memo.get((k, lb))
                if lp is None:
                    lp = memo[(k, lb)] = _log_poisson_tail(k, lb)
                if lp + tail_u > log_alpha[cls]:
                    st.log_p = lp + tail_u
                    st.significant = False
                    continue
            if self._score(c, st, t, lb):
                out.append(self._significant(st, c, t))
        return out

    def _significant(self, st: Cand, c: str, t: float) -> str:
        st.significant = True  # (again): a new witness of a significant pattern joins it
        until = t + self._rate_window
        for v in st.wit.values():
            self._explained[v[3]] = until
        return c

    def pair(self, c: str, kind: str, w: str, reporter: str, link: str) -> tuple[str, str, str, float]:
        """(candidate, witness, candidate class, :meth:`own_share`) for :meth:`add`; ``kind`` is ``c``'s
        kind (``"link"`` for a cable), ``link`` the link the report names (``""``: none)."""
        links = self._links
        return (c, w, links[c].kind if kind == "link" else kind, self.own_share(c, reporter, link))

    def own_share(self, c: str, reporter: str, link: str) -> float:
        """The reporter's own part of candidate ``c``'s exposure to its class, ``E(c, class)``: 1 when it
        is ``c`` or inside ``c``; ``1/deg`` when it is an end of the link it names (a far end of a link
        into ``c``, or an end of the cable ``c``); else 0. ``q * own_share`` is the reporter's own share
        of ``mu(c)``, so never more than ``mu(c)``: the screens in :meth:`add` and :meth:`_score` use it
        as the smallest background the pattern can have. (A far end is never inside: an HGX GPU naming
        its link to a chip of its own node is 1/deg of the chip's exposure, not 1; a chip with fewer
        GPU links than a GPU has links has less than one GPU's worth in all.)"""
        if c == reporter or c in self._topo.ancestors(reporter):
            return 1.0
        ln = self._links.get(link) if link else None
        if ln is not None and reporter in (ln.a, ln.b):
            return 1.0 / self._index.deg(reporter)
        return 0.0

    def support(self, c: str, now: float) -> list[SymptomKey]:
        """Symptom keys behind ``c``'s witnesses within the window."""
        st = self._cands.get(c)
        if st is None:
            return []
        if isinstance(st, tuple):
            return [st[4]] if now - st[0] <= self.window else []
        return [k for k, t in st.keys.items() if now - t <= self.window]

    def surprise(self, c: str) -> float:
        """``log10(alpha / p)`` of ``c`` at its last scoring (> 0: significant); 0 when unknown."""
        st = self._cands.get(c)
        if st is None:
            return 0.0
        return (self._log_alpha[self._cls(c)] - (st.log_p if isinstance(st, Cand) else 0.0)) / math.log(10)

    def scored_surprise(self, c: str) -> float | None:
        """:meth:`surprise` of ``c`` when it has a scored pattern, else None (no witness in the window,
        or one witness on one symptom, which the screens never score). A pattern the screens stopped
        counts at their bound, which is never farther from ``alpha`` than the full statistic: the
        evaluation's closest approach of a missed truth (``scoring.Outcome.closest``)."""
        return self.surprise(c) if isinstance(self._cands.get(c), Cand) else None

    def near(self, t: float, decades: float) -> list[tuple[str, float, int, float]]:
        """Candidates whose live pattern is not significant at ``t`` but within ``decades`` of it:
        (candidate, decades short of ``alpha``, witnesses, newest witness time). A candidate is scored in
        full only when its last scoring (a screen's bound, never farther from ``alpha`` than the full
        statistic at the rates of that time) was within ``decades``; the rest costs a comparison (a pattern
        the rates learned since would bring nearer is listed at its next event). The full scoring is of a
        copy: ``t`` (the controller's clock) may be past the stream, and the engine's own state must not
        lose a witness that a late event, stamped before ``t``, would still count."""
        out: list[tuple[str, float, int, float]] = []
        cutoff = t - self.window
        for c, st in self._cands.items():
            if not isinstance(st, Cand) or st.significant or self.surprise(c) < -decades:
                continue
            newest = max((v[0] for v in st.wit.values()), default=-math.inf)
            if newest < cutoff:
                continue
            probe = Cand(dict(st.wit), dict(st.keys), st.cls, st.units, st.oldest)
            self._score_plain(c, probe, t, 0.0)  # (a pattern kept from before a move is not watched)
            short = (probe.log_p - self._log_alpha[probe.cls]) / _LN10
            if 0.0 < short <= decades and probe.wit:
                out.append((c, short, len(probe.wit), newest))
        return out

    def is_significant(self, c: str) -> bool:
        st = self._cands.get(c)
        return isinstance(st, Cand) and st.significant

    def moved(self, from_slot: str, to_slot: str, t: float) -> None:
        """A unit left ``from_slot`` for ``to_slot``. The weak pattern seen at the old slot (the slot
        itself, what is inside it, the cables on it) is kept for ``rate_window`` twice: as evidence
        that *stays* with the slot (its cabling, its connector) and, for the unit and what it carries,
        as evidence that *follows* it to the same relative place under ``to_slot``. The live patterns
        there start afresh: the occupant changed. A later pattern at either place is combined with
        the kept one (:meth:`_score`)."""
        self._keep_left(from_slot, to_slot, t, self._live_log_p)

    def _score_live(self, c: str, st: Cand, t: float) -> bool:
        """:meth:`_score` of ``c``'s witnesses now, without the screens and without a pattern kept from an
        earlier move (``st.log_p``: the live pattern's ln p)."""
        hist = self._hist.pop(c, None)
        try:
            return self._score(c, st, t, 0.0)
        finally:
            if hist is not None:
                self._hist[c] = hist

    def _live_log_p(self, c: str, st: Cand, t: float) -> float:
        """What a move keeps: the pattern seen at the slot, never combined with one an earlier move left
        there. Combined, the second half of a swap handed the unit that left the evidence of the unit that
        arrived (a healthy NIC named ``follows_serial`` for its partner's pattern: test_coherence_moves.py)."""
        self._score_live(c, st, t)
        return st.log_p

    # -- the statistic ------------------------------------------------------------------------------------

    def _score(self, c: str, st: Cand, t: float, mu_lb: float) -> bool:
        hist = self._hist.get(c) if self._hist else None
        if hist:
            # the live pattern alone first, against the class's threshold; else with the one kept
            return self._score_live(c, st, t) or self._combined(st, t, hist)
        return self._score_plain(c, st, t, mu_lb)

    def _score_plain(self, c: str, st: Cand, t: float, mu_lb: float) -> bool:
        """:meth:`_score` of the live pattern ``st`` alone (a pattern kept from before a move not looked at)."""
        wit = st.wit
        if st.oldest < t - self.window:
            prune(st, t - self.window)
        k = len(wit)
        units = st.units
        log_alpha = self._log_alpha[st.cls]
        # Repetition (units beyond one per witness) is evidence about the thing a witness reports
        # on — its cable, itself — not about a switch or unit it shares with others: a flapping
        # cable's 12 minutes must not make its leaf surprising. Shared parts use k alone.
        tail_u = self._tail(st.cls, units, k)
        ln = self._links.get(c) if st.cls in self._cables else None  # a cable's class is its link kind
        if ln is None:
            # Screen: mu >= mu_lb (this reporter's own share of the exposure) and the tail grows
            # with mu, so even the smallest possible background leaves the pattern unsurprising.
            # Spares most noise events the exposure (a walk over the candidate's links).
            memo = self._poisson_memo
            lp = memo.get((k, mu_lb))
            if lp is None:
                lp = memo[(k, mu_lb)] = _log_poisson_tail(k, mu_lb)
            if lp + tail_u > log_alpha:
                st.log_p = lp + tail_u
                st.significant = False
                return False
        if ln is not None:  # two possible witnesses with unequal odds: the exact tail, not Poisson
            pa, pb = self._p_end(ln.a), self._p_end(ln.b)
            tail = pa * pb if k >= 2 else 1.0 - (1.0 - pa) * (1.0 - pb) if k == 1 else 1.0
            log_k = math.log(max(tail, 1e-300))
        else:
            log_k = self._witnesses_log_p(c, wit, k, t)
        st.log_p = log_k + tail_u
        st.basis = ""
        sig = st.log_p <= log_alpha
        if not sig:
            st.significant = False
        return sig

    def _witnesses_log_p(self, c: str, wit: dict[str, tuple[float, int, int, str]], k: int, t: float) -> float:
        """ln P(``k`` or more distinct witnesses of ``c`` under the background), on the better of two
        scales. The second, shorter one: the witnesses active in the last third of the window (a fault's
        witnesses come closer together than the background's). A background reporter is active for an
        interval, not an instant (about its mean excess minutes), so the share of ``mu`` that falls in the
        short scale is (W/3 + d) / (W + d). The better of the two scales pays a factor 2 for the choice."""
        mu = self.mu(c)
        log_k = _log_poisson_tail(k, mu)
        short_s = self.window / SHORT
        k_s = sum(1 for v in wit.values() if v[0] >= t - short_s)
        if k_s >= 2:
            d = self._rep[0] * UNIT_S
            log_k = min(log_k, _log_poisson_tail(k_s, mu * (short_s + d) / (self.window + d))) + _LN2
        return log_k

    def explained_away(self, c: str, t: float) -> bool:
        """Whether unit ``c``'s live pattern is significant only through one part inside it whose own
        live pattern is significant at ``t``: the witnesses of ``c`` with a live report the part does not
        account for (:meth:`_unaccounted`) are what the background gives in 1 window in 20 or more
        (:data:`RESIDUAL_P`; tested against the whole unit's background, which leans towards the part). An
        HGX node whose NVSwitch chip degrades, plus the background's reports from elsewhere in the node, is
        the chip's pattern, not the node's; GPUs erring towards the chip and towards other chips of the
        node too are the node's (decision 0116). The part
        is judged on its witnesses inside the window now, not on a flag from its last scoring (which can
        be older than the window) nor on a pattern kept from before a move. A unit's own pattern
        significant only with one kept from before a move is not explained away (``basis``: the move is
        the evidence)."""
        st = self._cands.get(c)
        if not isinstance(st, Cand) or not st.significant or st.basis or st.cls not in _UNIT_KINDS:
            return False
        topo = self._topo
        cutoff = t - self.window
        for d in topo.descendants(c):
            sd = self._cands.get(d)
            if not isinstance(sd, Cand) or not sd.significant:
                continue
            live = {w: v for w, v in sd.wit.items() if v[0] >= cutoff}
            if not live or sd.cls in self._cables or not self._live_significant(d, sd.cls, live, t):
                continue
            rest = self._unaccounted(c, st, {d, *topo.descendants(d)}, cutoff)
            if not rest or self._witnesses_log_p(c, rest, len(rest), t) > _LOG_RESIDUAL:
                return True
        return False

    def _unaccounted(self, c: str, st: Cand, part: set[str], cutoff: float) -> dict[str, tuple[float, int, int, str]]:
        """``c``'s live witnesses with a report since ``cutoff`` that ``part`` (a part and what it
        contains) does not account for: a report by something else about something else (a GPU's link
        errors towards another chip, a NIC's corrected AER, the unit's own reports), not one by the part
        or on a link to it. Each keeps the time of its newest such report, not that of a report the part
        explains (which would put it on the short scale by the part's evidence)."""
        links, index, wit = self._links, self._index, st.wit
        out: dict[str, tuple[float, int, int, str]] = {}
        for key, when in st.keys.items():
            reporter, link = key
            if when < cutoff or reporter in part:
                continue
            if link:
                ln = links[link]
                if ln.a in part or ln.b in part:
                    continue
            placed = index.placements.get(key)
            for cand, w, _, _ in placed[1] if placed is not None else index.place(reporter, link)[1]:
                if cand != c:
                    continue
                # The unit reporting about itself: its witnesses are one per kind ("self:<kind>").
                names = [n for n in wit if n.startswith("self:")] if w == "self" else [w]
                for n in names:
                    v = wit.get(n)
                    if v is not None and v[0] >= cutoff and (n not in out or when > out[n][0]):
                        out[n] = (when, v[1], v[2], v[3])
        return out

    def _live_significant(self, c: str, cls: str, wit: dict[str, tuple[float, int, int, str]], t: float) -> bool:
        """Whether ``wit`` (witnesses of candidate ``c`` of class ``cls``, not a cable) is significant now,
        as :meth:`_score` judges a live pattern, without changing ``c``'s state."""
        k = len(wit)
        units = sum(v[1] for v in wit.values())
        return self._witnesses_log_p(c, wit, k, t) + self._tail(cls, units, k) <= self._log_alpha[cls]

    def _tail(self, cls: str, units: int, k: int) -> float:
        """The scan factor and, for what is not shared, the repetition tail of ``units`` over ``k``
        witnesses (repetition is evidence about the thing a witness reports on, not about a switch or a
        unit it shares with others)."""
        return _LOG_SCAN if cls in _SHARED_KINDS else _LOG_SCAN + self._log_rep_tail(units - k, k)

    def _log_rep_tail(self, e: int, k: int) -> float:
        """ln P(the excess minutes of ``k`` background witnesses sum to ``e`` or more)."""
        v = self._rep_memo.get((e, k))
        if v is None:
            m, size = self._rep
            v = self._rep_memo[(e, k)] = (
                _log_poisson_tail(e, k * m) if size == math.inf else _log_negbin_tail(e, k * size, size / (size + m))
            )
        return v

    def _p_end(self, r: str) -> float:
        """Probability that end ``r`` of a cable reports on that cable in one window. An end with one link
        (a NIC) reports on it exactly when it reports a link-naming event: its class's rate of those, a
        part of its rate of any report (the whole of it while no component of the class has named its
        link in the rate window). An end with more links keeps its rate of any report over its links (decision 0115: for
        a switch the over-count and the bursts' several links roughly cancel). Decision 0118."""
        cls = self._kind_of(r)
        q = self._q.get(cls, PRIOR_Q)
        deg = self._index.deg(r)
        if deg == 1:
            return min(1.0, q, self._q_link.get(cls, q))
        return min(1.0, q / deg)

    def mu(self, c: str) -> float:
        """Expected number of witnesses of ``c`` in one window under the background."""
        exp = self._index.exposure.get(c)
        if exp is None:
            exp = self._index.expose(c)
        q = self._q
        return sum(e * q.get(r, PRIOR_Q) for r, e in exp.items())

    def _refresh(self, t: float) -> None:
        """Re-learn the background rates from the last ``rate_window`` of the stream."""
        self._refreshed = t
        span = max(self.window, min(self._rate_window, t - self._start))
        if self._explained and t - self._swept >= self._rate_window:
            self._explained = {r: u for r, u in self._explained.items() if u > t}
        left_out = [r for r, u in self._explained.items() if u > t]
        # learn() drops a (kind, class) nobody reported in the rate window: its class is back at the prior
        # (and, for the link-naming reports, _p_end back at the any-report rate), as before its first report
        # and after a restart primed with the rate window.
        cutoff = t - self._rate_window
        self._q, self._rep = learn(self._seen, cutoff, span / self.window, left_out, self._class_size)
        self._q_link = learn(self._seen_link, cutoff, span / self.window, left_out, self._class_size)[0]
        self._poisson_memo = {}
        self._rep_memo = {}
        if t - self._swept >= self.window:
            self._swept = t
            gone = t - self.window
            for c in [c for c, st in self._cands.items()
                      if (st[0] < gone if isinstance(st, tuple) else all(v[0] < gone for v in st.wit.values()))]:
                del self._cands[c]


def _saw(seen: dict[tuple[str, str], Reporters], kind: str, rclass: str, reporter: str, t: float, minute: int) -> None:
    """``reporter`` (class ``rclass``) reported ``kind`` at ``t``: one more minute of it, if a new one."""
    rs = seen.get((kind, rclass))
    if rs is None:
        rs = seen[(kind, rclass)] = Reporters()
    prev = rs.last.get(reporter)
    if prev is None or prev[2] != minute:
        rs.saw(reporter, t, minute, prev)
