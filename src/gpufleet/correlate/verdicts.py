"""The correlation engine's output side: from the active symptoms to ranked suspects and verdicts.

:class:`~gpufleet.correlate.engine.Engine` keeps the window (events in, symptoms activated and expired)
and calls :meth:`Verdicts._evaluate` with the symptoms that changed; this base class holds what that
decides with and what it leaves behind: the cluster of symptoms sharing candidates with the changed
ones, its explanation (:mod:`gpufleet.correlate.explain`, with the coherence statistic's significant
candidates), each explanation made a :class:`~gpufleet.correlate.model.Suspect` (its finding: shared,
follows the serial, stays at the slot, degrading; its confidence, action, evidence and reason), and the
verdicts standing since (new; changed when the confidence moves by ``min_change`` or more or the action
or finding changes; cleared below ``clear_confidence``).
A unit named by an actionable verdict is recorded by serial, so one named again after an earlier
episode is a repeat offender (:mod:`gpufleet.correlate.offenders`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime

from gpufleet.correlate.coherence import Coherence
from gpufleet.correlate.describe import action_for, reason_for
from gpufleet.correlate.explain import Explanation, SymptomLike, explain
from gpufleet.correlate.index import TopologyIndex
from gpufleet.correlate.inventory import Inventory, MoveRecord
from gpufleet.correlate.kept import FOLLOWS, STAYS
from gpufleet.correlate.model import Basis, Ref, Suspect, SuspectAction, SymptomKey, Verdict, VerdictStatus, sort_refs
from gpufleet.correlate.offenders import (
    REPEAT_WINDOW,
    UNIT_KINDS,
    Naming,
    UnitHistory,
    earlier_episodes,
    repeat_reason,
)
from gpufleet.correlate.symptoms import Symptom
from gpufleet.domain.topology import Component, Link, Topology

log = logging.getLogger("gpufleet.correlate.engine")  # one logger for the engine, whichever half speaks


class Verdicts:
    """Suspects and verdicts from the engine's active symptoms (the base of ``Engine``, which sets every
    attribute declared here in its ``__init__``)."""

    # What the engine's input side keeps and this side reads.
    topology: Topology
    inventory: Inventory
    coherence: Coherence | None
    _comps: Mapping[str, Component]
    _links: Mapping[str, Link]
    _index: TopologyIndex
    _kinds: dict[str, str]
    _syms: dict[SymptomKey, Symptom]
    _cover: dict[str, set[Symptom]]  # candidate -> the active symptoms it could explain
    _folded: dict[str, tuple[tuple[float, Ref], ...]]
    _now: float
    _win: float
    _emit: float
    _clear: float
    _min_change: float
    # What this side keeps.
    _emitted: dict[str, tuple[Suspect, str]]  # output component -> (suspect, candidate)
    _standing: dict[str, float]  # candidate -> confidence of its standing verdict
    _reexplained: set[tuple[str, str]]  # (part, unit): re-explained once while the unit stood
    history: UnitHistory
    _repeats: dict[str, tuple[Naming, ...]]  # serial -> its earlier episodes' first namings

    def kind_of(self, ident: str) -> str:
        """A component's kind; ``"link"`` for any other id."""
        k = self._kinds.get(ident)
        return k if k is not None else self._index.kind_of(ident)

    def _witness(self, c: str, kind: str, s: SymptomLike) -> str:
        if not s.link:
            return s.reporter if s.reporter != c else "self"
        if s.reporter == c and isinstance(s, Symptom) and s.top <= 0:
            return "self"  # a part's own informational reports about its ports: one noisy part, one witness
        ln = self._links[s.link]
        if kind in ("node", "compute_tray", "switch_tray"):
            for e in (ln.a, ln.b):
                if self._index.unit_of(e) == c:
                    return e
            return s.reporter
        if c in (ln.a, ln.b):
            far = ln.other(c)
            far_unit = self._index.unit_of(far)
            # Distinct far *units* (trays, nodes): a fault in one compute tray must not frame the
            # NVSwitch chips its GPUs talk to; inside an HGX node, distinct GPUs.
            return far_unit if far_unit is not None and far_unit != self._index.unit_of(c) else far
        return s.link

    def _explain(self, syms: set[Symptom]) -> list[Explanation]:
        cover = self._cover
        coh = self.coherence
        return explain(syms, lambda c: cover.get(c, ()), self.kind_of, self._witness,
                       significant=self._significant if coh is not None else None)

    def _significant(self, c: str) -> bool:
        """``c``'s pattern is significant in its own right: not only through one significant part inside
        it (``Coherence.explained_away``: the chip's pattern does not make its node the culprit)."""
        coh = self.coherence
        return coh is not None and coh.is_significant(c) and not coh.explained_away(c, self._now)

    def _cluster(self, seeds: set[str]) -> tuple[set[str], set[Symptom]]:
        cands, syms = set(seeds), set[Symptom]()
        stack = list(seeds)
        while stack:
            for s in self._cover.get(stack.pop(), ()):
                if s not in syms:
                    syms.add(s)
                    for c in s.cands:
                        if c not in cands:
                            cands.add(c)
                            stack.append(c)
        return cands, syms

    def _evaluate(self, changed: list[Symptom], time: datetime) -> list[Verdict]:
        seeds = {c for s in changed for c in s.cands}
        cands, syms = self._cluster(seeds)
        now: dict[str, Suspect] = {}
        expl: dict[str, Explanation] = {}
        for ex in self._explain(syms):
            sus = self._suspect(ex, full=False)
            now[sus.component] = sus
            expl[sus.component] = ex
        out: list[Verdict] = []
        for comp, (prev, cand) in list(self._emitted.items()):
            if cand not in cands and comp not in now:
                continue
            cur = now.pop(comp, None)
            if cur is None or cur.confidence < self._clear:
                del self._emitted[comp]
                self._standing.pop(cand, None)
                if self._reexplained:
                    self._reexplained = {p for p in self._reexplained if p[1] != cand}
                out.append(Verdict(VerdictStatus.CLEARED, prev, time))
                continue
            self._standing[expl[comp].candidate] = cur.confidence  # current, even when not re-emitted
            if (
                abs(cur.confidence - prev.confidence) >= self._min_change
                or cur.action != prev.action
                or cur.finding != prev.finding
            ):
                full = self._suspect(expl[comp], full=True)
                self._emitted[comp] = (full, expl[comp].candidate)
                out.append(Verdict(VerdictStatus.CHANGED, full, time))
        for comp, cur in now.items():
            if cur.confidence >= self._emit:
                self._name_unit(cur, time)
                full = self._suspect(expl[comp], full=True)
                self._emitted[comp] = (full, expl[comp].candidate)
                self._standing[expl[comp].candidate] = cur.confidence
                out.append(Verdict(VerdictStatus.NEW, full, time))
        for v in out:
            log.info(
                "%s: verdict %s (%s, confidence %.2f, action %s)",
                v.suspect.component,
                v.status,
                v.suspect.finding,
                v.suspect.confidence,
                v.suspect.action,
            )
        return out

    def _name_unit(self, s: Suspect, time: datetime) -> None:
        """Record an actionable new verdict on a unit; note its earlier episodes (a repeat offender)."""
        if s.serial is None or s.action is SuspectAction.OBSERVE or s.kind not in UNIT_KINDS:
            return
        if s.finding is Basis.STAYS_AT_SLOT:
            return  # the slot, not the unit in it
        before = earlier_episodes(self.history.named(s.serial, time - REPEAT_WINDOW), time)
        if before:
            self._repeats[s.serial] = tuple(before)
        self.history.record(Naming(s.serial, s.component, s.kind, time))

    def _alternative(self, comp: str, conf: float, of: Suspect) -> Suspect:
        return Suspect(
            comp,
            self.kind_of(comp) if comp in self._comps else self._links[comp].kind,
            self.inventory.serial_at(comp),
            conf,
            SuspectAction.OBSERVE,
            of.evidence,
            self.topology.nodes_behind(comp),
            Basis.ALTERNATIVE,
            f"alternative to {of.component}",
            of.symptoms,
        )

    def _suspect(self, ex: Explanation, *, full: bool) -> Suspect:
        c = ex.candidate
        kind = ex.kind if ex.kind != "link" else self._links[c].kind
        conf = ex.confidence
        finding = Basis.SHARED
        component = c
        slots = self._slots(c)
        coh = self.coherence
        weak = coh.basis(c) if coh is not None else ""  # significant only with a pattern from before a move
        rec: MoveRecord | None = self.inventory.follows(slots, weak=weak == FOLLOWS)
        if rec is not None:
            finding = Basis.FOLLOWS_SERIAL
        else:
            rec = self.inventory.stays(slots, weak=weak == STAYS)
            if rec is not None:
                finding = Basis.STAYS_AT_SLOT
                if ex.kind != "link":
                    component = rec.from_slot
                    kind = self.kind_of(component)
        if finding is Basis.SHARED and all(isinstance(s, Symptom) and s.boosted for s in ex.symptoms):
            finding = Basis.DEGRADING  # no symptom reached its own count: weak signals only
        if coh is not None and self._significant(c):
            # A set of witnesses this unlikely under the background: at the false-alarm threshold as
            # sure as the emit level, each further decade of surprise halves the doubt.
            conf = max(conf, min(0.99, 1.0 - (1.0 - self._emit) * 0.5 ** coh.surprise(c)))
        if rec is not None:
            conf = min(0.99, 1.0 - (1.0 - conf) * 0.3)
        action = action_for(ex, kind, finding, conf, self._emit)
        serial = self.inventory.serial_at(component) if component in self._comps else None
        before = self._repeats.get(serial, ()) if serial is not None and finding is not Basis.STAYS_AT_SLOT else ()
        if before and action is not SuspectAction.OBSERVE:
            action = SuspectAction.DRAIN_AND_REPLACE
        evidence: tuple[Ref, ...] = ()
        reason = ""
        if full:
            evidence = self._evidence(ex, rec)
            reason = reason_for(ex, finding, rec)
            if before and serial is not None:
                reason = f"{reason}; {repeat_reason(serial, before)}"
        return Suspect(
            component,
            kind,
            serial,
            round(conf, 4),
            action,
            evidence,
            self.topology.nodes_behind(component) if full else (),
            finding,
            reason,
            len(ex.symptoms),
            len(before),
        )

    def _slots(self, c: str) -> tuple[str, ...]:
        if c in self._links:
            ln = self._links[c]
            return (c, ln.a, ln.b)
        return (c, *self.topology.ancestors(c))

    def _evidence(self, ex: Explanation, rec: MoveRecord | None) -> tuple[Ref, ...]:
        cutoff = self._now - self._win
        refs: list[Ref] = []
        places: set[str] = set()
        for s in ex.symptoms:
            if isinstance(s, Symptom):
                refs.extend(r for t, r in s.refs if t >= cutoff)
                places.add(s.reporter)
        for p in places:
            refs.extend(r for t, r in self._folded.get(p, ()) if t >= cutoff)
        if rec is not None:
            refs.extend(rec.evidence)
        return sort_refs(refs)

    def emitted(self) -> list[Suspect]:
        """The verdicts currently standing (as last emitted)."""
        return [s for s, _ in self._emitted.values()]
