"""Per-event weighing and per-(reporter, link) symptom state of the correlation engine.

:func:`weigh` turns an event's one judgement (:mod:`gpufleet.domain.judgement`) into the engine's
:class:`Weighing` (fold, ignore, or count with which step and severity), once per distinct key;
:class:`Symptom` accumulates the in-window weight of one reporter's trouble with one link (or with
itself) and implements :class:`~gpufleet.correlate.explain.SymptomLike`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufleet.correlate.explain import SEVERITY_WEIGHT
from gpufleet.correlate.model import Ref, SymptomKey
from gpufleet.domain.catalog import Action, Catalog
from gpufleet.domain.events import EventKind, Severity
from gpufleet.domain.judgement import Judgement

IGNORE, FOLD, SYMPTOM = 0, 1, 2
SEV_INDEX = {Severity.INFO: 0, Severity.DEGRADED: 1, Severity.FATAL: 2}
FLAPPY = frozenset({EventKind.LINK_FLAP, EventKind.LINK_DOWN})
_REFS_PER_SYMPTOM = 32
_NEVER = float("-inf")
_NO_ACTION = Action.NONE  # an enum member looked up on its class costs ~60 ns; symptoms are made often


@dataclass(frozen=True, slots=True)
class Weighing:
    role: int
    step: float  # weight one event adds to its symptom (1.0 activates it)
    sev: int
    action: Action
    damped: bool
    floor: int = 0  # severity index an activated run of these info events escalates to (catalog)
    coherent: bool = True  # a witness for the coherence statistic (gpufleet.correlate.coherence)


class Symptom:
    """Mutable per-(reporter, link) state; implements explain.SymptomLike.

    One object the cycle collector tracks per symptom, nothing more: the counts per severity are ints
    and the recent evidence an immutable tuple of ``(time, ref)`` (atomic: the collector stops tracking
    it), because every full collection re-scans each tracked object the window holds (at 131,072 GPUs
    a list and a deque per symptom made collection half the engine's time; docs/benchmarks.md).
    """

    __slots__ = (
        "action",
        "active",
        "boosted",
        "cands",
        "floor",
        "gone",
        "key",
        "last",
        "link",
        "local",
        "n0",
        "n1",
        "n2",
        "refs",
        "reporter",
        "serial",
        "top",
        "weight",
        "wit",
    )

    def __init__(self, key: SymptomKey, cands: tuple[str, ...], local: frozenset[str], serial: int = 0) -> None:
        self.key = key
        self.serial = serial  # tells this symptom from an earlier one of the same key (archived by a move)
        self.reporter, self.link = key
        self.cands = cands
        self.local = local
        self.weight = 0.0
        self.n0 = self.n1 = self.n2 = 0  # in-window events per severity index (info, degraded, fatal)
        self.boosted = False  # activated by the coherence statistic, not by its own count
        self.active = False
        self.top = -1
        self.refs: tuple[tuple[float, Ref], ...] = ()  # the newest _REFS_PER_SYMPTOM, oldest first
        self.last = _NEVER
        self.action = _NO_ACTION
        self.gone = False
        self.floor = 0
        self.wit: tuple[tuple[str, str, str, float], ...] | None = None  # (candidate, witness) pairs, on first use

    @property
    def counts(self) -> tuple[int, int, int]:
        return (self.n0, self.n1, self.n2)

    def count(self, level: int, delta: int) -> None:
        if level == 0:
            self.n0 += delta
        elif level == 1:
            self.n1 += delta
        else:
            self.n2 += delta

    def cite(self, t: float, ref: Ref) -> None:
        refs = self.refs
        self.refs = (*refs[1:], (t, ref)) if len(refs) >= _REFS_PER_SYMPTOM else (*refs, (t, ref))

    @property
    def selfsev(self) -> int:
        return self.top if not self.link else -1

    def strength(self) -> float:
        """Severity weight, raised (up to 2x) by the volume of evidence beyond activation."""
        if self.top < 0:
            return 0.0
        return SEVERITY_WEIGHT[self.top] * min(2.0, 1.0 + 0.3 * math.log(max(1.0, self.weight)))

    def _top(self) -> int:
        top = 2 if self.n2 else 1 if self.n1 else 0 if self.n0 else -1
        return self.floor if self.n0 and self.floor > top else top


def weigh(catalog: Catalog, kind: EventKind, code: int | None, j: Judgement, info_activation: int) -> Weighing:
    """Fold, ignore, or count (with which step and severity) events of this (kind, code) judged ``j``."""
    damped = kind in FLAPPY
    if kind in (EventKind.CHECK_PASSED, EventKind.MOVED, EventKind.GPU_IDLE):
        return Weighing(IGNORE, 0.0, 0, j.action, damped)
    severity = j.severity
    if kind is EventKind.SXID and severity is Severity.INFO and not j.collateral:
        # A non-fatal SXID (corrected, replayed) never activates by count, but is a witness for the
        # coherence statistic: several ports of one chip erring together is a pattern.
        return Weighing(SYMPTOM, 0.0, 0, j.action, damped)
    if j.collateral or (kind in (EventKind.XID, EventKind.SXID) and severity is Severity.INFO):
        return Weighing(FOLD, 0.0, 0, j.action, damped, coherent=False)
    if severity is Severity.INFO:
        count, floor = info_activation, 0
        for esc in catalog.escalations:
            if esc.kind == kind.value and esc.code in (None, code):
                count, floor = esc.count, SEV_INDEX[esc.severity]
        return Weighing(SYMPTOM, 1.0 / max(1, count), 0, j.action, damped, floor)
    return Weighing(SYMPTOM, 1.0, SEV_INDEX[severity], j.action, damped)
