"""What the correlation engine answers: ranked suspects and the verdict changes that drive the lifecycle.

The JSON form is ``gpufleet`` verdicts (docs/formats.md)::

    {"suspects": [{"component": "r01-sw4-nvsw1", "kind": "nvswitch", "serial": "...", "confidence": 0.94,
                   "action": "drain_and_replace", "evidence": [12, 15, 19]}]}
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

Ref = int | str  # a 1-based line number of the events file, or a HealthEvent id
# A symptom's key, (reporter, link id or ""). Typed as a tuple of any length, not tuple[str, str], for the
# compiled engine (decision 0123): mypyc keeps a fixed-length tuple unboxed and builds a new tuple object
# each time it stores or looks one up, where Python passes the one key object along.
SymptomKey = tuple[str, ...]



class SuspectAction(StrEnum):
    """What to do about a suspect. The lifecycle policy maps these onto node decisions."""

    OBSERVE = "observe"  # too little evidence to act on; keep watching
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    DRAIN_AND_INSPECT = "drain_and_inspect"  # drain the affected nodes, run diagnostics
    DRAIN_AND_REPLACE = "drain_and_replace"  # drain the affected nodes, replace the unit (RMA)
    CHECK_CABLING = "check_cabling"  # reseat/replace the cable or inspect the slot's port/connector
    ISOLATE_SWITCH = "isolate_switch"  # spine/core: route around it (no node drain), then replace


class Basis(StrEnum):
    """How the engine reached a suspect (for the explanation shown to operators)."""

    SHARED = "shared"  # the component the symptoms have in common
    FOLLOWS_SERIAL = "follows_serial"  # the pattern moved with the unit to its new slot
    STAYS_AT_SLOT = "stays_at_slot"  # the pattern stayed at the slot after its unit was swapped
    ALTERNATIVE = "alternative"  # a less likely explanation of another suspect's symptoms
    DEGRADING = "degrading"  # weak signals only (the coherence statistic), no fault yet: act at a checkpoint


@dataclass(frozen=True, slots=True)
class Suspect:
    """One ranked explanation. ``component`` is a component or link id of the topology."""

    component: str
    kind: str  # the component kind, or the link kind ("ib", "nvlink") for a link
    serial: str | None
    confidence: float
    action: SuspectAction
    evidence: tuple[Ref, ...]
    affected_nodes: tuple[str, ...] = ()
    finding: Basis = Basis.SHARED
    reason: str = ""
    symptoms: int = 0  # distinct symptoms (reporter, link) explained
    repeats: int = 0  # earlier episodes in which this unit (serial, any slot) was named: a repeat offender

    def to_dict(self) -> dict[str, Any]:
        """The public verdict form (exactly the documented keys)."""
        return {
            "component": self.component,
            "kind": self.kind,
            "serial": self.serial,
            "confidence": round(self.confidence, 3),
            "action": self.action.value,
            "evidence": list(self.evidence),
        }


# The watch list's reach: patterns within this many decades of their false-alarm share (about what one to
# three more coincident witnesses bring, docs/correlate.md §Watch list); farther than the most, every
# background pattern would be listed.
WATCH_DECADES = 2.0
MAX_WATCH_DECADES = 6.0


@dataclass(frozen=True, slots=True)
class Watched:
    """A candidate whose weak pattern is close to significance but not there (the watch list): no verdict,
    nothing acts on it; it shows an operator what would need a few more witnesses. ``decades``: how far
    the pattern's p-value is above the candidate's false-alarm share, in decades (0 < decades)."""

    component: str
    kind: str
    decades: float
    witnesses: int
    reporters: tuple[str, ...]  # the reporters behind the witnesses (at most 10, sorted)
    last: datetime  # the newest report in the pattern

    def to_dict(self) -> dict[str, Any]:
        return {"component": self.component, "kind": self.kind, "decades_short": self.decades,
                "witnesses": self.witnesses, "reporters": list(self.reporters), "last": self.last.isoformat()}


class VerdictStatus(StrEnum):
    NEW = "new"
    CHANGED = "changed"  # confidence moved by >= 0.1, or the action / finding changed
    CLEARED = "cleared"  # the evidence aged out of the window, or the unit was moved away


@dataclass(frozen=True, slots=True)
class Verdict:
    status: VerdictStatus
    suspect: Suspect
    time: datetime


def verdicts_json(suspects: Sequence[Suspect]) -> str:
    """``{"suspects": [...]}`` ranked as given."""
    if not suspects:
        return '{"suspects": []}'
    body = ",\n  ".join(json.dumps(s.to_dict()) for s in suspects)
    return '{"suspects": [\n  ' + body + "\n]}"


def sort_refs(refs: Iterable[Ref]) -> tuple[Ref, ...]:
    return tuple(sorted(set(refs), key=lambda r: (isinstance(r, str), r if isinstance(r, str) else f"{r:012d}")))
