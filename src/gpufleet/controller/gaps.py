"""Telling the lifecycle about units missing from a node's inventory (decision 0133): when a gap found at
a registration is said again, and when a node in revalidation is told it once more.

``Identity.register`` finds the gaps (``controller/slots.py``); these two rules decide, from the stored
reports, transitions and repair rungs, which of them the controller ingests:

* :func:`quiet`: a gap is said at every registration that still has it (an agent registers on every
  start: a reboot rung that did not help says so), except to a node *put back* into service after the
  gap's last report, by an operator or out of repair or revalidation (people put it back knowing: each
  agent restart must not drain it again, 0132's lesson). The scheduler's and the policy's moves (a job
  placed, suspect) are no putting back. A gap whose reports retention has deleted is older than the
  retention period on a node in service: it is quiet too.
* :func:`short_revalidations`: a node in revalidation still short of a unit is told once more after it
  entered revalidation, which counts only what comes after it: the report the host's registration made
  in repair would otherwise let a validation pass on the units that are left. Not while a host the
  repair restarted has not registered since the repair began (the gap is then of before the repair,
  which may have brought the unit back; the host's own registration says what is there).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.lifecycle.repair import REBOOT_STEPS
from gpufleet.lifecycle.states import SCHEDULABLE, Actor, NodeState

from .identity import MISSING_RULES
from .store.repairs import RepairStore

if TYPE_CHECKING:
    from .service import Controller

_SERVING = frozenset(s.value for s in SCHEDULABLE)


def quiet(c: Controller, node: str) -> frozenset[str]:
    """The slots of ``node`` whose missing unit is not said again at this registration."""
    if c.engine.nodes[node].state not in SCHEDULABLE:
        return frozenset()
    last = c.store.last_reports(node, (EventKind.GPU_LOST, EventKind.CHECK_FAILED), MISSING_RULES)
    forgotten = c.identity.gaps(node) - last.keys()  # its reports deleted by retention: an old gap, lived with
    if not last:
        return forgotten
    back = c.store.last_entry(node, _SERVING, since=min(last.values()), from_outside=True,
                              or_actor=Actor.OPERATOR.value)
    return forgotten | {slot for slot, t in last.items() if back is not None and back > t}


def short_revalidations(c: Controller, now: datetime) -> list[HealthEvent]:
    """The gaps to tell once more, now, to the nodes in revalidation that are still short (once per stay:
    the caller records ``c.gaps_told`` after it ingested them)."""
    out: list[HealthEvent] = []
    for node in c.identity.short():
        rec = c.engine.nodes.get(node)
        if rec is None or rec.state is not NodeState.REVALIDATE:
            continue
        told = c.gaps_told.get(node)
        if told is not None and told >= rec.since:
            continue
        # A rung is recorded when its outcome is seen, which may be after the rebooted host registered:
        # the repair's start is what the registration is compared with.
        repair = c.store.last_entry(node, (NodeState.REPAIR.value,), until=rec.since)
        if repair is not None:
            registered = c.store.inventory_registered(node)
            restarted = any(a.step in REBOOT_STEPS for a in RepairStore(c.store).history(node, repair))
            if restarted and (registered is None or registered < repair):
                continue
        out += c.identity.missing(node, now)
    return out
