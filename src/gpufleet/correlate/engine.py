"""The streaming root-cause engine: events in, verdicts (new / changed / cleared suspects) out.

Per event the work is a few dictionary operations: weigh the event's one judgement (attached by the
controller at ingest, else :func:`gpufleet.domain.judgement.judge` once per distinct key), add its
weight to its *symptom* (reporter, link), append it to the window's queue and expire what fell out of
the window. Only when a symptom becomes active or inactive (or its severity
rises) does the engine re-explain the connected cluster of symptoms that share candidates with it
(:mod:`gpufleet.correlate.explain`), so the cost of an event does not depend on the fleet's size.
That output side (cluster, explanation, suspects, standing verdicts) is the engine's base class,
:class:`gpufleet.correlate.verdicts.Verdicts`; this module is the input side and the window.

Weighing (from the judgement, :mod:`gpufleet.domain.judgement`):

* collateral codes (XID 45) and informational XID/SXID codes (application errors such as XID 13, 31,
  43) are *folded*: never a symptom, but attached as evidence to a suspect that covers their component;
* degraded or fatal events activate their symptom at once;
* informational hardware events (corrected ECC, corrected AER, link errors) are rate-activated: a
  symptom activates after ``count`` of them within the window, ``count`` and the severity it then
  carries taken from the catalog's escalation for that kind (e.g. 50 link errors -> degraded), or
  ``info_activation`` (staying informational) when it has none;
* link flaps and link downs within ``holddown`` of the previous one on the same symptom count once
  (flap damping); verdicts change only when confidence moves by ``min_change`` or more, and clear
  only when the evidence ages out (hysteresis).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from gpufleet.correlate.coherence import Coherence
from gpufleet.correlate.explain import UNITS as _UNIT_KINDS  # what contains other candidates
from gpufleet.correlate.index import Pairs, index_of
from gpufleet.correlate.inventory import Inventory, MoveRecord
from gpufleet.correlate.model import WATCH_DECADES, Ref, Suspect, SymptomKey, Verdict, Watched, sort_refs
from gpufleet.correlate.offenders import MemoryHistory, UnitHistory
from gpufleet.correlate.symptoms import FOLD, IGNORE, Symptom, Weighing, weigh
from gpufleet.correlate.verdicts import Verdicts
from gpufleet.domain.catalog import Action, Catalog, load_default_catalog
from gpufleet.domain.eventio import EventFields, FileEvent
from gpufleet.domain.events import EventKind, HealthEvent, Severity
from gpufleet.domain.false_alarms import FALSE_ALARM_BUDGET
from gpufleet.domain.false_alarms import false_alarm_budget as _check_budget
from gpufleet.domain.judgement import Judgement, judge, judge_event
from gpufleet.domain.topology import Topology

_FOLDED_PER_COMPONENT = 8
_REEXPLAINED_KEPT = 4096  # (part, unit) pairs remembered at most
_EPS = 1e-9
_NO_LOCAL: frozenset[str] = frozenset()
_ABSORB = 0.9
_MOVED = EventKind.MOVED  # module constants: an enum member looked up on its class costs ~60 ns
_NO_ACTION = Action.NONE
_KIND_VALUE = {k: k.value for k in EventKind}  # the same: an enum's .value is a property call


class Engine(Verdicts):
    """Incremental fault correlation over one topology.

    ``observe`` / ``observe_health_event`` return the verdicts that are new or changed by that event
    (usually none). ``suspects(now)`` returns the full ranked list, including alternatives.
    """

    def __init__(
        self,
        topology: Topology,
        window: timedelta = timedelta(minutes=30),
        catalog: Catalog | None = None,
        *,
        emit_confidence: float = 0.5,
        clear_confidence: float = 0.3,
        min_change: float = 0.1,
        holddown: timedelta = timedelta(seconds=10),
        info_activation: int = 5,
        move_memory: timedelta = timedelta(days=7),
        coherence_window: timedelta = timedelta(minutes=15),
        false_alarm_budget: float = FALSE_ALARM_BUDGET,
        coherence: bool = True,
        history: UnitHistory | None = None,
    ) -> None:
        _check_budget(false_alarm_budget, "false_alarm_budget")  # with coherence off too: no silent nonsense
        self.topology = topology
        self.window = window
        self.catalog = catalog if catalog is not None else load_default_catalog()
        self._win = window.total_seconds()
        self._emit, self._clear, self._min_change = emit_confidence, clear_confidence, min_change
        self._holddown = holddown.total_seconds()
        self._info_activation = info_activation
        self._comps = topology.components
        self._links = topology.links
        # (kind, code, stated severity, rule) or (kind, code, attached judgement) -> its weighing
        self._weighed: dict[tuple[object, ...], Weighing] = {}
        self._syms = {}
        self._cover = {}
        # (time, symptom key, symptom serial, step, severity index) per counted event. Only atomic
        # values, not the Symptom: the cycle collector stops tracking such tuples, so the window's
        # worth of entries is not re-scanned by every full collection.
        self._queue: deque[tuple[float, SymptomKey, int, float, int]] = deque()
        self._serial = 0
        self._folded = {}  # newest last; atomic: untracked
        self._fold_queue: deque[tuple[float, str]] = deque()  # (time, component) per folded event
        self._emitted = {}
        self._standing = {}
        self._reexplained = set()
        self._index = index_of(topology)  # kinds, units, degrees: memoised once per topology
        self._kinds = self._index.kinds
        self._placements = self._index.placements
        self.inventory = Inventory(topology, move_memory)
        # Evidence of a unit a move pushed out of its slot (a swap's first half), kept until that
        # unit's own move names it: (active symptoms, their evidence) by serial.
        self._displaced: dict[str, tuple[int, list[Ref]]] = {}
        self._now = float("-inf")
        # Evidence from coherence: distinct witnesses per candidate against the learned background;
        # ``false_alarm_budget`` is false verdicts per node-day the statistic may cost.
        self.coherence = (
            Coherence(topology, self._index.kind_of, window_s=coherence_window.total_seconds(),
                      budget_per_node_day=false_alarm_budget) if coherence else None
        )
        # Units named by actionable verdicts (by serial, any slot): a unit named again after an
        # earlier episode is a repeat offender (correlate/offenders.py).
        self.history = history if history is not None else MemoryHistory()
        self._repeats = {}
        self.unknown = 0  # events naming a component the topology does not have
        self.late = 0  # events older than the window on arrival

    @property
    def in_window(self) -> int:
        """Counted events still inside the window (each observed event is counted at most once)."""
        return len(self._queue)

    # -- input ----------------------------------------------------------------------------------------

    def observe(self, ev: FileEvent) -> list[Verdict]:
        """Feed one ``gpufleet.event/v1`` event; returns new/changed/cleared verdicts."""
        if ev.kind is _MOVED:
            return self._move(ev.serial or "", ev.from_slot or "", ev.to_slot or "", ev.time, ev.line)
        return self._event(ev.component, ev.link, ev.kind, ev.code, ev.severity, ev.time, ev.line)

    def observe_fields(self, fields: EventFields) -> list[Verdict]:
        """:meth:`observe` for an event as :func:`~gpufleet.domain.eventio.read_event_fields` yields it:
        the same verdicts, without building a :class:`FileEvent` per line (the file path's hot loop)."""
        line, time, kind, comp, code, link, serial, from_slot, to_slot, sev, _, _, _ = fields
        if kind is _MOVED:
            return self._move(serial or "", from_slot or "", to_slot or "", time, line)
        return self._event(comp, link, kind, code, sev, time, line)

    def observe_health_event(self, ev: HealthEvent) -> list[Verdict]:
        """Feed a controller :class:`HealthEvent`; ``ev.component`` (a topology id) or else ``ev.node``."""
        if ev.kind is EventKind.MOVED:
            attrs = dict(ev.attrs)
            return self._move(attrs.get("serial", ""), attrs.get("from", ""), attrs.get("to", ""), ev.time, ev.id)
        comp, judged = self._placed(ev)
        return self._event(comp, ev.link, ev.kind, ev.code, ev.severity, ev.time, ev.id, ev.attr("rule"), judged)

    @property
    def background_window(self) -> timedelta:
        """How far back the coherence statistic learns its background (0 without coherence): what
        :meth:`prime` can use."""
        return timedelta(seconds=self.coherence.rate_window) if self.coherence is not None else timedelta(0)

    def prime(self, events: Iterable[HealthEvent], since: datetime) -> int:
        """Learn ``events`` (oldest first, all before the window about to be replayed) as background
        only: no symptom, no verdict. A controller rebuilding its window after a restart primes the
        engine with the :attr:`background_window` of stream before that window, then replays the
        window: the replay judges against the background the engine had learned, not a cold start's
        (which underestimates it). ``since``: where the primed stream begins (the stream's own first
        event may come later in a quiet fleet). An event feeds the background when
        :meth:`observe_health_event` would have fed it in order: counted (a damped kind outside the
        hold-down of its symptom's last counted event), of a coherent weighing, on a component of the
        topology. Not reproduced: the reporters a significant pattern explained, which the running engine
        leaves out of its rates (nothing is judged here); events that arrived older than the window,
        which it dropped; and a move's reset of its slot's hold-downs. Returns the events read."""
        coh = self.coherence
        n = 0
        if coh is None:
            return n
        coh.learned_since(since.timestamp())
        last: dict[SymptomKey, float] = {}  # symptom key -> its last counted event (the hold-down)
        for ev in events:
            n += 1
            if ev.kind is EventKind.MOVED:
                continue
            comp, judged = self._placed(ev)
            if comp not in self._comps:
                continue
            kind = ev.kind
            j = self._weighing(kind, ev.code, ev.severity, ev.attr("rule"), judged)
            if j.role in (IGNORE, FOLD):
                continue
            t = ev.time.timestamp()
            key: SymptomKey = (comp, ev.link if ev.link is not None and ev.link in self._links else "")
            before = last.get(key)
            if j.damped and before is not None and t - before < self._holddown:
                continue
            last[key] = t  # a counted event, coherent or not, starts its symptom's hold-down (as _event)
            if j.coherent:
                coh.note(t, _KIND_VALUE[kind], comp, self._kinds.get(comp) or self.kind_of(comp), key[1])
        return n

    def _weighing(self, kind: EventKind, code: int | None, sev: Severity | None, rule: str,
                  judged: Judgement | None) -> Weighing:
        """How an event of these counts (cached per distinct key: the catalog judges each once)."""
        key: tuple[object, ...] = (kind, code, sev, rule) if judged is None else (kind, code, judged)
        j = self._weighed.get(key)
        return j if j is not None else self._weigh(key, kind, code, sev, rule, judged)

    def _placed(self, ev: HealthEvent) -> tuple[str, Judgement | None]:
        """``ev``'s component (a topology id, or else its node) and the judgement to weigh it by."""
        comp = ev.component if ev.component and ev.component in self._comps else ev.node
        judged = ev.judgement
        if judged is None and ev.attr("nvl5_row"):  # a decoded subcode row is judged by its own entry
            judged = judge_event(self.catalog, ev)
        return comp, judged

    def _event(
        self,
        comp: str,
        link: str | None,
        kind: EventKind,
        code: int | None,
        sev: Severity | None,
        time: datetime,
        ref: Ref,
        rule: str = "",
        judged: Judgement | None = None,
    ) -> list[Verdict]:
        t = time.timestamp()
        if t > self._now:
            self._now = t
        elif t < self._now - self._win:
            self.late += 1
            return []
        cutoff = self._now - self._win
        changed = self._expire(self._now) if self._queue and self._queue[0][0] < cutoff else None
        if self._fold_queue and self._fold_queue[0][0] < cutoff:
            self._expire_folded(cutoff)
        fresh: list[Symptom] = []
        force = False
        j = self._weighing(kind, code, sev, rule, judged)
        if j.role == IGNORE:
            pass
        elif comp not in self._comps:
            self.unknown += 1
        elif j.role == FOLD:
            fq = self._folded.get(comp, ())
            self._folded[comp] = (*fq[1:], (t, ref)) if len(fq) >= _FOLDED_PER_COMPONENT else (*fq, (t, ref))
            self._fold_queue.append((t, comp))
        else:
            if link is not None and link not in self._links:
                self.unknown += 1
                link = None
            key: SymptomKey = (comp, link or "")
            sym = self._syms.get(key)
            if sym is None:
                self._serial += 1
                sym = self._syms[key] = Symptom(key, (), _NO_LOCAL, self._serial)
            sym.cite(t, ref)
            if not (j.damped and t - sym.last < self._holddown):
                sym.last = t
                step, level = j.step, j.sev
                sym.weight += step
                sym.count(level, 1)
                sym.floor = max(sym.floor, j.floor)
                self._queue.append((t, sym.key, sym.serial, step, level))
                if sym.action is _NO_ACTION or level >= sym.top:
                    sym.action = j.action
                if not sym.active and sym.weight >= 1.0 - _EPS:
                    self._activate(sym)
                    fresh.append(sym)
                elif sym.active and (j.sev or j.floor) > sym.top:
                    sym.top = j.sev or j.floor  # a worse event (or an escalated run) raised severity
                    fresh.append(sym)
                if self.coherence is not None and j.coherent:
                    pairs = sym.wit if sym.wit is not None else self._place_pairs(sym)
                    sig = self.coherence.add(t, _KIND_VALUE[kind], comp, self._kinds.get(comp) or self.kind_of(comp),
                                             sym.key, pairs)
                    for c in sig:
                        if not self.coherence.explained_away(c, t):  # its part's pattern: boost nothing more
                            fresh += self._boost(c, t)
                        if c not in self._standing and self._explains_a_standing_unit(c, t):
                            # A part's pattern now explains a unit that stands: the cluster is explained
                            # again even though the unit's verdict would absorb the symptoms.
                            behind = self._supporting(c, t)
                            if behind:
                                fresh += behind
                                force = True
        if changed:
            return self._evaluate([*changed, *fresh], time)
        if fresh and (force or not (len(fresh) == 1 and self._absorbed(fresh[0]))):
            return self._evaluate(fresh, time)
        return []

    def _explains_a_standing_unit(self, c: str, t: float) -> bool:
        """Whether a unit containing ``c`` stands on a verdict that its pattern no longer supports
        (``Coherence.explained_away``): once per (part, unit) while the unit stands, so a part that keeps
        gathering witnesses does not re-explain its cluster at every one."""
        standing = self._standing
        if not standing or c not in self._comps:
            return False
        coh = self.coherence
        assert coh is not None
        done = self._reexplained
        for a in self.topology.ancestors(c):
            if a in standing and (c, a) not in done and coh.explained_away(a, t):
                if len(done) >= _REEXPLAINED_KEPT:
                    done.clear()  # bounded: forgetting only allows one more re-explanation
                done.add((c, a))
                return True
        return False

    def _supporting(self, c: str, t: float) -> list[Symptom]:
        """The active symptoms behind ``c``'s witnesses in the coherence window."""
        assert self.coherence is not None
        syms = self._syms
        return [s for key in self.coherence.support(c, t) if (s := syms.get(key)) is not None and s.active]

    def _activate(self, sym: Symptom) -> None:
        if not sym.cands:  # computed on first need: most symptoms never activate
            self._place(sym)
        if sym.local is _NO_LOCAL:  # likewise: with coherence on every symptom is placed, few activate
            sym.local = self._local(sym)
        sym.active = True
        sym.top = sym._top()
        for c in sym.cands:
            cov = self._cover.get(c)
            if cov is None:
                cov = self._cover[c] = set()
            cov.add(sym)

    def _pairs(self, sym: Symptom) -> Pairs:
        """(candidate, witness) for the coherence statistic: a cable's witness is the end that
        reported; a component reporting about itself is ``self`` however many of its ports it names
        (one noisy chip is one witness); otherwise the distinct far unit / inner component."""
        coh = self.coherence
        assert coh is not None
        reporter = sym.reporter
        kinds = self._kinds
        unit = self._index.unit_of(reporter)
        out = []
        for c in sym.cands:
            kind = kinds.get(c) or self.kind_of(c)
            if kind == "link":
                w = reporter
            elif c == reporter:
                w = "self"
            elif kind in _UNIT_KINDS and unit == c:
                w = reporter  # a chip inside an HGX node naming three ports is one witness
            else:
                w = self._witness(c, kind, sym)
            out.append(coh.pair(c, kind, w, reporter, sym.link))
        return tuple(out)

    def _boost(self, c: str, t: float) -> list[Symptom]:
        """``c``'s set of witnesses is significant: activate the weak symptoms behind it (each as if it
        had reached its count now; they age out of the window like any other activation)."""
        assert self.coherence is not None
        out: list[Symptom] = []
        for key in self.coherence.support(c, t):
            sym = self._syms.get(key)
            if sym is None or sym.active:
                continue
            step = 1.0 - sym.weight
            sym.weight = 1.0
            sym.count(0, 1)
            self._queue.append((t, sym.key, sym.serial, step, 0))
            self._activate(sym)
            sym.boosted = True
            out.append(sym)
        return out

    def _absorbed(self, sym: Symptom) -> bool:
        """A standing verdict at ABSORB confidence or more already explains this symptom: one more
        witness cannot move it by ``min_change``, so skip re-explaining the cluster (suspects() and
        the next evaluation still see the symptom)."""
        standing = self._standing
        return any(standing.get(c, 0.0) >= _ABSORB for c in sym.cands)

    def _place(self, sym: Symptom) -> None:
        placed = self._placements.get(sym.key)
        sym.cands = placed[0] if placed is not None else self._candidates(sym.reporter, sym.link or None)

    def _place_pairs(self, sym: Symptom) -> Pairs:
        """``sym``'s candidates and their coherence pairs: pure functions of the topology and the
        symptom's key, kept per topology (a long-lived engine meets the same reporters again)."""
        placed = self._placements.get(sym.key)
        if placed is None:
            sym.cands, pairs = self._index.place(sym.reporter, sym.link)  # = _candidates, _pairs
            sym.wit = pairs
            self._index.keep_placement(sym.key, sym.cands, pairs)
        else:
            self._index.hits += 1
            sym.cands, pairs = placed
            sym.wit = pairs
        return pairs

    def _local(self, sym: Symptom) -> frozenset[str]:
        """``sym``'s candidates but the far end of its link when that is a GPU or NIC (explain.py)."""
        far = self._links[sym.link].other(sym.reporter) if sym.link else None
        return frozenset(c for c in sym.cands if c != far or self.kind_of(c) not in ("gpu", "nic"))

    def _weigh(self, key: tuple[object, ...], kind: EventKind, code: int | None, sev: Severity | None, rule: str,
               judged: Judgement | None) -> Weighing:
        if judged is None:  # a file event, or one that did not come through the controller's ingest
            judged = judge(self.catalog, kind.value, code, stated=sev, rule=rule)
        w = self._weighed[key] = weigh(self.catalog, kind, code, judged, self._info_activation)
        return w

    def _candidates(self, reporter: str, link: str | None) -> tuple[str, ...]:
        out: list[str] = []
        ends: tuple[str, ...] = (reporter,)
        if link is not None:
            ln = self._links[link]
            out.append(link)
            ends = (ln.a, ln.b) if reporter in (ln.a, ln.b) else (reporter, ln.a, ln.b)
        unit_of = self._index.unit_of
        for e in ends:
            if e not in out:
                out.append(e)
            u = unit_of(e)
            if u is not None and u not in out:
                out.append(u)
        kinds = self._kinds
        return tuple(c for c in out if (kinds.get(c) or self.kind_of(c)) != "rack")

    def _expire(self, now: float) -> list[Symptom] | None:
        cutoff = now - self._win
        q = self._queue
        changed: list[Symptom] | None = None
        while q and q[0][0] < cutoff:
            _, key, serial, step, sev = q.popleft()
            sym = self._syms.get(key)  # an entry outlives its symptom only if a move archived it
            if sym is None or sym.serial != serial:
                continue
            sym.weight -= step
            sym.count(sev, -1)
            if sym.active:
                if sym.weight < 1.0 - _EPS:
                    self._deactivate(sym)
                    changed = [*changed, sym] if changed else [sym]
                else:
                    top = sym._top()
                    if top != sym.top:
                        sym.top = top
                        changed = [*changed, sym] if changed else [sym]
            if sym.weight <= _EPS and not sym.active:
                self._syms.pop(sym.key, None)
        return changed

    def _expire_folded(self, cutoff: float) -> None:
        """Forget a component's folded events once all of them are older than the window: evidence
        never cites those, and without this the engine would keep a queue for every component that
        ever had one (90,000 after six hours of heavy noise on 131,072 GPUs, all re-scanned by the
        cycle collector)."""
        q, folded = self._fold_queue, self._folded
        while q and q[0][0] < cutoff:
            comp = q.popleft()[1]
            recent = folded.get(comp)
            if recent is not None and max(e[0] for e in recent) < cutoff:
                del folded[comp]

    def _deactivate(self, sym: Symptom) -> None:
        sym.active = False
        sym.boosted = False
        sym.top = -1
        for c in sym.cands:
            cov = self._cover.get(c)
            if cov is not None:
                cov.discard(sym)
                if not cov:
                    del self._cover[c]

    # -- inventory moves --------------------------------------------------------------------------------

    def _move(self, serial: str, from_slot: str, to_slot: str, time: datetime, ref: Ref) -> list[Verdict]:
        t = time.timestamp()
        self._now = max(self._now, t)
        if from_slot not in self._comps or to_slot not in self._comps:
            self.unknown += 1
            return []
        changed = self._expire(self._now) or []
        self.inventory.forget_before(time)
        displaced = self.inventory.serial_at(to_slot)
        if self.coherence is not None:
            self.coherence.moved(from_slot, to_slot, t)
        touched = set(self.inventory.move(serial, from_slot, to_slot))
        archived: list[Symptom] = []
        for sym in list(self._syms.values()):
            if any(e in touched for e in self._ends(sym)):
                archived.append(sym)
        subtree = {from_slot, *self.topology.descendants(from_slot)}
        old = {s for s in archived if any(e in subtree for e in self._ends(s))}
        evidence = [r for s in old if s.active for _, r in s.refs]
        active = sum(1 for s in old if s.active)
        if displaced is not None and displaced != serial:
            # The unit that sat at ``to_slot`` waits for its own move: its evidence goes with it, so a
            # swap reads the same whichever half arrives first.
            dest = {to_slot, *self.topology.descendants(to_slot)}
            pushed = [s for s in archived if s not in old and s.active and any(e in dest for e in self._ends(s))]
            if pushed:
                self._displaced[displaced] = (len(pushed), [r for s in pushed for _, r in s.refs])
        carried, carried_refs = self._displaced.pop(serial, (0, []))
        self.inventory.record(MoveRecord(serial, from_slot, to_slot, time, active + carried,
                                         (*sort_refs(evidence + carried_refs), ref)))
        for sym in archived:
            sym.gone = True
            self._syms.pop(sym.key, None)
            if sym.active:
                self._deactivate(sym)
                changed.append(sym)
        return self._evaluate(changed, time) if changed else []

    def _ends(self, sym: Symptom) -> tuple[str, ...]:
        """The reporter and, for a link symptom, both ends of its link."""
        if not sym.link:
            return (sym.reporter,)
        ln = self._links[sym.link]
        return (sym.reporter, ln.a, ln.b)

    # -- output -----------------------------------------------------------------------------------------

    def watching(self, now: datetime, decades: float = WATCH_DECADES, limit: int = 20) -> list[Watched]:
        """The watch list: candidates whose weak pattern is within ``decades`` of significance at ``now``
        but not significant, and that no standing verdict names (a verdict from its counts, a fatal link
        down say, is already acted on), closest first, at most ``limit``. Nothing acts on them. Empty
        without coherence."""
        coh = self.coherence
        if coh is None:
            return []
        t = now.timestamp()
        standing = self._standing
        rows = [Watched(c, self.kind_of(c), round(short, 2), k,
                        tuple(sorted({key[0] for key in coh.support(c, t)}))[:10],
                        datetime.fromtimestamp(newest, UTC))
                for c, short, k, newest in coh.near(t, decades) if c not in standing]
        rows.sort(key=lambda w: (w.decades, w.component))
        return rows[:limit]

    def suspects(self, now: datetime | None = None) -> list[Suspect]:
        """Every current suspect, ranked by confidence (primaries and their alternatives)."""
        if now is not None:
            t = now.timestamp()
            self._now = max(self._now, t)
            self._expire(self._now)
        active = {s for s in self._syms.values() if s.active}
        out: dict[str, Suspect] = {}
        alts: dict[str, Suspect] = {}
        done: set[Symptom] = set()
        for s in active:
            if s in done:
                continue
            _, syms = self._cluster(set(s.cands))
            done |= syms
            for ex in self._explain(syms):
                sus = self._suspect(ex, full=True)
                if sus.component not in out or out[sus.component].confidence < sus.confidence:
                    out[sus.component] = sus
                for other, conf in ex.alternatives:
                    alt = self._alternative(other, conf, sus)
                    if other not in alts or alts[other].confidence < conf:
                        alts[other] = alt
        ranked = sorted(out.values(), key=lambda x: (-x.confidence, x.component))
        ranked += sorted((a for k, a in alts.items() if k not in out), key=lambda x: (-x.confidence, x.component))
        return ranked
