"""What a node is out of service for: the fault a repair works on and a validation checks for.

The fault is the worst evidence of the decision that took the node out of service (a failed
validation since then means that fault came back); a node that failed burn-in, or was never out,
is in for its validation failure. ``Fault.fabric`` says whether that decision's evidence points at
the fabric (``lifecycle.validation.is_fabric``): then the validation pairs the node with known-good
nodes.

A validation job that never started (cancelled at ``validation_start_timeout``) fails the validation
with a check event marked :data:`NEVER_STARTED`; :func:`never_ran` tells the repairer that the failure
sent the node to repair, so that it does not count it as the fault coming back (decision 0130).
"""

from __future__ import annotations

from gpufleet.domain.catalog import Action
from gpufleet.domain.events import HealthEvent
from gpufleet.domain.judgement import judgement_of
from gpufleet.lifecycle.repair import Fault
from gpufleet.lifecycle.states import NodeState
from gpufleet.lifecycle.validation import is_fabric

from .service import Controller
from .store.repairs import RepairStore
from .store.repo import Page

_OUT = frozenset({NodeState.SUSPECT.value, NodeState.DRAINING.value})
# attrs key of the failed check the reconciler records for a validation job that never started (its value:
# the scheduler's pending reason)
NEVER_STARTED = "never_started"


def fault_of(c: Controller, node: str) -> Fault:
    """The fault ``node`` is out for (see the module docstring)."""
    fallback = None
    chosen = None
    for d in c.store.decisions(node=node, status="applied", page=Page(200)):
        if d.rule == "validation_passed":
            break
        if d.rule == "validation_failed":
            fallback = fallback or d
        elif d.to_state in _OUT:
            chosen = d
            break
    basis = chosen or fallback
    if basis is None:
        return Fault("unknown", Action.CONTACT_SUPPORT, "no decision names the fault")
    events = RepairStore(c.store).evidence(node, [str(x) for x in basis.evidence])
    if not events:
        return Fault(basis.rule, Action.CONTACT_SUPPORT, basis.reason)
    catalog = c.policy_file.catalog
    worst = max(events, key=lambda e: (judgement_of(catalog, e).severity.rank, e.time))
    return Fault(_key(worst), judgement_of(catalog, worst).action, basis.reason, fabric=is_fabric(events))


def _key(e: HealthEvent) -> str:
    return f"{e.kind}:{e.code}" if e.code is not None else str(e.kind)


def never_ran(c: Controller, decision_id: str) -> str:
    """Why the validation whose failure is decision ``decision_id`` never ran (its failed check's message),
    or "" when that decision is not a failed validation, or one of its failed checks did run. A run that
    never started says nothing about the node's hardware."""
    d = c.store.decision(decision_id)
    if d is None or d.rule != "validation_failed":
        return ""
    events = RepairStore(c.store).evidence(d.node, [str(x) for x in d.evidence])
    if not events or not all(e.attr(NEVER_STARTED) for e in events):
        return ""
    return min(events, key=lambda e: e.time).message
