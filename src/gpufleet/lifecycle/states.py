"""The node lifecycle as data: a transition table and the one function that moves a node.

::

    new -> burn_in -> ready <-> in_service
                        |          |
                        +-> suspect <+   (degraded evidence; node still usable)
                              |
    (fatal) ready/in_service -+-> draining -> drained -> repair -> revalidate -> ready
                                                 ^                    |
                                                 +-------- (fail) ----+
    any state -> retired (terminal)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from gpufleet.domain.errors import Conflict


class NodeState(StrEnum):
    NEW = "new"
    BURN_IN = "burn_in"
    READY = "ready"
    IN_SERVICE = "in_service"
    SUSPECT = "suspect"
    DRAINING = "draining"
    DRAINED = "drained"
    REPAIR = "repair"
    REVALIDATE = "revalidate"
    RETIRED = "retired"


S = NodeState

TRANSITIONS: Mapping[NodeState, frozenset[NodeState]] = {
    # A freshly racked node is burned in before it ever sees a job.
    S.NEW: frozenset({S.BURN_IN, S.RETIRED}),
    # Burn-in passes (ready) or finds a fault (repair); a hang during burn-in drains it.
    S.BURN_IN: frozenset({S.READY, S.REPAIR, S.DRAINING, S.RETIRED}),
    # Idle and healthy: the scheduler places a job (in_service); evidence makes it suspect; a fatal
    # fault drains it at once.
    S.READY: frozenset({S.IN_SERVICE, S.SUSPECT, S.DRAINING, S.RETIRED}),
    # Running a job: the job ends (ready), or the same fault paths as ready.
    S.IN_SERVICE: frozenset({S.READY, S.SUSPECT, S.DRAINING, S.RETIRED}),
    # Under suspicion but still usable: cleared (ready/in_service) when the evidence ages out or an
    # operator clears it; drained at the running job's next checkpoint or on escalation.
    S.SUSPECT: frozenset({S.READY, S.IN_SERVICE, S.DRAINING, S.RETIRED}),
    # The scheduler stops placing work; running jobs finish, checkpoint or are requeued.
    S.DRAINING: frozenset({S.DRAINED, S.RETIRED}),
    # Empty: handed to repair (automatically or by an operator).
    S.DRAINED: frozenset({S.REPAIR, S.REVALIDATE, S.RETIRED}),
    # Being fixed (reset, reseat, RMA); the technician reports done -> revalidate.
    S.REPAIR: frozenset({S.REVALIDATE, S.RETIRED}),
    # Active checks decide: pass -> ready (resumed in the scheduler); fail -> back to repair.
    S.REVALIDATE: frozenset({S.READY, S.REPAIR, S.RETIRED}),
    # Terminal: decommissioned.
    S.RETIRED: frozenset(),
}

# States in which the node takes no new work: these count against the blast-radius budget.
UNAVAILABLE: frozenset[NodeState] = frozenset({S.DRAINING, S.DRAINED, S.REPAIR, S.REVALIDATE})
# States in which a node may run (or be given) work.
SCHEDULABLE: frozenset[NodeState] = frozenset({S.READY, S.IN_SERVICE, S.SUSPECT})


class Actor(StrEnum):
    POLICY = "policy"
    OPERATOR = "operator"
    SCHEDULER = "scheduler"
    SYSTEM = "system"


@dataclass(frozen=True, slots=True)
class Transition:
    """One recorded move of one node. ``actor_id`` names the operator token or the component."""

    node: str
    from_state: NodeState
    to_state: NodeState
    time: datetime
    reason: str
    actor: Actor
    actor_id: str = ""
    evidence: tuple[str, ...] = ()
    decision_id: str | None = None


def can_transition(src: NodeState, dst: NodeState) -> bool:
    return dst in TRANSITIONS[src]


def transition(
    node: str,
    src: NodeState,
    dst: NodeState,
    *,
    time: datetime,
    reason: str,
    actor: Actor,
    actor_id: str = "",
    evidence: tuple[str, ...] = (),
    decision_id: str | None = None,
) -> Transition:
    """Validate and record the move ``src -> dst``; raises Conflict for an illegal move."""
    if dst not in TRANSITIONS[src]:
        allowed = ", ".join(sorted(TRANSITIONS[src])) or "none (terminal)"
        raise Conflict(f"node {node}: illegal transition {src} -> {dst}; allowed from {src}: {allowed}")
    if not reason:
        raise Conflict(f"node {node}: transition {src} -> {dst} needs a reason")
    return Transition(node, src, dst, time, reason, actor, actor_id, evidence, decision_id)


def path_home(src: NodeState) -> list[NodeState]:
    """A shortest legal path from ``src`` to READY (or to RETIRED when READY is unreachable)."""
    for goal in (S.READY, S.RETIRED):
        frontier: list[list[NodeState]] = [[src]]
        seen = {src}
        while frontier:
            path = frontier.pop(0)
            if path[-1] == goal:
                return path
            for nxt in sorted(TRANSITIONS[path[-1]]):
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append([*path, nxt])
    return [src]
