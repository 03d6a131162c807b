"""Between the API and the decisions: every observation is named, judged and counted once.

The controller's ingest runs each batch through these steps, in this order (docs/DATA_FLOW.md):

1. **prepare** (before the events are stored): name the event with topology ids
   (:class:`~gpufleet.controller.identity.Identity`), then judge it once with the site's catalog
   (:func:`gpufleet.domain.judgement.judge_event`) and attach the judgement. Nothing downstream judges.
2. **admit** (for the events that were new to the store): one fault, one count. The same fault seen by
   a second source (an XID from NVML and from the kernel log, a check that saw it too) within
   ``merge_window`` is merged onto the first observation — stored, with ``fault_of`` naming the first,
   and not counted again by the policy or the correlator.
3. **hold**: with a topology, a link event whose cable leads to a shared part (a leaf, spine or core
   switch, an NVSwitch or switch tray) waits ``correlation_hold`` before the per-node policy sees it,
   so the correlator can blame the switch first and the switch becomes ONE decision. The correlator
   sees it at once. When the hold ends the event goes to the policy unless a standing verdict on a
   shared part already covers it (that decision handles the node).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import partial

from gpufleet.domain.catalog import Catalog
from gpufleet.domain.events import LINK_KINDS, EventKind, HealthEvent, Severity
from gpufleet.domain.judgement import Judgement, judge_event
from gpufleet.domain.topology import Topology

log = logging.getLogger(__name__)

_SHARED_KINDS = frozenset({"leaf_switch", "spine_switch", "core_switch", "nvswitch", "switch_tray"})
_UNMERGED = frozenset({EventKind.MOVED, EventKind.HEARTBEAT_LOST, EventKind.CHECK_PASSED})

FaultKey = tuple[str, str, int | None, str | None]


@dataclass(frozen=True, slots=True)
class Merge:
    """Event ``id`` of ``node`` is another source's sighting of the fault first reported as ``fault_of``."""

    node: str
    id: str
    fault_of: str


# The first observation of a fault in the merge window: (time, event id, sources, severity rank of the
# judgement it was counted with). A plain tuple of atomic values, like its key, so the cycle collector
# stops tracking the merge index (one entry per fault of the last two merge windows: ~140,000 at 2,000
# reports/s in the overload benchmark). A NamedTuple would stay tracked: CPython untracks exact tuples only.
_Fault = tuple[datetime, str, tuple[str, ...], int]


@dataclass(slots=True)
class Admitted:
    counted: list[HealthEvent]  # new faults: to the correlator, and (unless held) to the policy
    to_policy: list[HealthEvent]  # the counted events the policy sees now
    merged: list[Merge]


class Admission:
    def __init__(self, catalog: Catalog, topology: Topology | None, *, merge_window: timedelta,
                 hold: timedelta, resolve: Callable[[HealthEvent], HealthEvent] | None = None) -> None:
        self.catalog = catalog
        self.topology = topology
        self.merge_window = merge_window
        self.hold = hold if topology is not None else timedelta(0)
        self.resolve = resolve
        self._faults: dict[FaultKey, _Fault] = {}
        self._order: deque[tuple[datetime, FaultKey]] = deque()
        self._held: deque[tuple[datetime, HealthEvent]] = deque()
        self._judged: dict[tuple[EventKind, int | None, Severity | None, str, str], Judgement] = {}
        self.merges = 0  # observations merged onto an earlier one since start (a metric)
        self._undo: list[Callable[[], object]] | None = None
        self._merges_before = 0

    # ---- all or nothing (the controller's write of what was admitted may fail) --------------
    def begin(self) -> None:
        """Log how to undo what :meth:`admit` and :meth:`release` change, until commit or rollback."""
        self._undo, self._merges_before = [], self.merges

    def commit(self) -> None:
        self._undo = None

    def rollback(self) -> None:
        """Undo every change since :meth:`begin`, newest first, without reading the database."""
        undo, self._undo = self._undo, None
        if undo is None:
            return
        for step in reversed(undo):
            step()
        self.merges = self._merges_before

    # ---- 1. name and judge ------------------------------------------------------------------
    def prepare(self, events: Sequence[HealthEvent], *, stored: bool = False) -> list[HealthEvent]:
        """The events named with topology ids and judged once (what is stored and decided on). ``stored``:
        events read back from the store, named at their ingest already: judged only (the catalog may
        have changed), never named again, since the identity names an agent's numbering as it is *now*
        (a GPU missing since renumbers the later ones: decision 0133)."""
        return list(self.prepare_each(events, stored=stored))

    def prepare_each(self, events: Iterable[HealthEvent], *, stored: bool = False) -> Iterator[HealthEvent]:
        """:meth:`prepare`, one event at a time (a long stream read from the store in batches)."""
        cache = self._judged
        resolve = None if stored else self.resolve
        for raw in events:
            e = resolve(raw) if resolve is not None else raw
            key = (e.kind, e.code, e.severity, e.attr("rule"), e.attr("nvl5_row"))
            j = cache.get(key)
            if j is None:  # the judgement depends on these five only: judge each distinct one once
                if len(cache) >= 4096:  # bounded whatever codes producers send
                    cache.clear()
                j = cache[key] = judge_event(self.catalog, e)
            yield replace(e, judgement=j)

    # ---- 2. merge and 3. hold ---------------------------------------------------------------
    def admit(self, fresh: Sequence[HealthEvent], now: datetime) -> Admitted:
        """Sort the newly stored ``fresh`` events into counted faults and merged sightings."""
        counted: list[HealthEvent] = []
        to_policy: list[HealthEvent] = []
        merged: list[Merge] = []
        for e in sorted(fresh, key=lambda e: e.time):
            first = self._merge(e)
            if first is not None:
                merged.append(Merge(e.node, e.id, first))
                continue
            counted.append(e)
            if self._holds(e):
                self._held.append((now + self.hold, e))
                if self._undo is not None:
                    self._undo.append(self._held.pop)
            else:
                to_policy.append(e)
        self.merges += len(merged)
        return Admitted(counted, to_policy, merged)

    def remember(self, events: Iterable[HealthEvent], now: datetime) -> None:
        """After a (re)start: rebuild the merge index from recent stored events, and hold again the
        recent link events the policy may not have seen (a decision made twice has the same id)."""
        for e in sorted(events, key=lambda e: e.time):
            self._merge(e)
            if self._holds(e) and e.time >= now - self.hold:
                self._held.append((now + self.hold, e))

    def release(self, now: datetime, covered: Callable[[HealthEvent], bool]) -> list[HealthEvent]:
        """Held events whose hold is over, for the policy; those ``covered`` by a shared part's verdict
        are dropped (that verdict's decision handles their node)."""
        out: list[HealthEvent] = []
        while self._held and self._held[0][0] <= now:
            item = self._held.popleft()
            if self._undo is not None:
                self._undo.append(partial(self._held.appendleft, item))
            e = item[1]
            if covered(e):
                log.info("%s: %s on %s is covered by a correlated verdict; no per-node decision",
                         e.node, e.kind, e.link)
            else:
                out.append(e)
        return out

    def next_release(self) -> datetime | None:
        return self._held[0][0] if self._held else None

    @property
    def held(self) -> int:
        return len(self._held)

    # ---- internals --------------------------------------------------------------------------
    def _holds(self, e: HealthEvent) -> bool:
        if self.topology is None or not self.hold or e.kind not in LINK_KINDS or not e.link:
            return False
        return self.shared_end(e.link) is not None

    def shared_end(self, link: str) -> str | None:
        """The far end of topology link ``link`` when it is a shared part (a switch), else None."""
        assert self.topology is not None
        ln = self.topology.links.get(link)
        if ln is None:
            return None
        comps = self.topology.components
        for end in (ln.a, ln.b):
            c = comps.get(end)
            if c is not None and c.kind.value in _SHARED_KINDS:
                return end
        return None

    def _merge(self, e: HealthEvent) -> str | None:
        """The id of the fault ``e`` is another source's sighting of, or None (then ``e`` is a fault)."""
        if e.kind in _UNMERGED:
            return None
        self._expire(e.time)
        key: FaultKey = (e.node, e.kind.value, e.code, e.component)
        f = self._faults.get(key)
        rank = e.judgement.severity.rank if e.judgement is not None else 0
        if f is not None and e.source not in f[2] and abs(e.time - f[0]) <= self.merge_window:
            first_time, first_id, sources, first_rank = f
            if self._undo is not None:
                self._undo.append(partial(self._restore, key, f))
            if rank > first_rank:
                # Another source knows the fault is worse (the kernel line's decoded NVLink5 row after
                # NVML's code-only XID 149): counted, so the worse judgement is the one acted on.
                log.info("%s: %s %s from %s is judged worse than %s (first seen by %s): counted", e.node, e.kind,
                         e.code if e.code is not None else "", e.source, first_id, ", ".join(sorted(sources)))
                self._faults[key] = (first_time, e.id, (*sources, e.source), rank)
                return None
            self._faults[key] = (first_time, first_id, (*sources, e.source), first_rank)
            log.info("%s: %s %s from %s merged onto %s (first seen by %s)", e.node, e.kind,
                     e.code if e.code is not None else "", e.source, first_id, ", ".join(sorted(sources)))
            return first_id
        if self._undo is not None:
            self._undo.append(partial(self._restore, key, f))
            self._undo.append(self._order.pop)
        self._faults[key] = (e.time, e.id, (e.source,), rank)
        self._order.append((e.time, key))
        return None

    def _restore(self, key: FaultKey, fault: _Fault | None) -> None:
        if fault is None:
            self._faults.pop(key, None)
        else:
            self._faults[key] = fault

    def _expire(self, t: datetime) -> None:
        cutoff = t - 2 * self.merge_window  # events may arrive a little out of order
        q = self._order
        undo = self._undo
        while q and q[0][0] < cutoff:
            when, key = q.popleft()
            f = self._faults.get(key)
            if f is not None and f[0] == when:
                del self._faults[key]
            if undo is not None:  # run in reverse: the fault comes back, then its place in the order
                undo.append(partial(q.appendleft, (when, key)))
                if f is not None and f[0] == when:
                    undo.append(partial(self._restore, key, f))
