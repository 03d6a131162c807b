"""Suspect nodes placed last: a node the policy holds as ``suspect`` (a degraded signal, not yet a
reason to drain) keeps its running work and stays schedulable, but the scheduler gives new work to
every other free node first (``Scheduler.place_last``: Slurm node weight, a Kubernetes
PreferNoSchedule taint). A node that leaves ``suspect`` (back in service, or drained) is placed
normally again.

Level-triggered, once per scheduler read: what the scheduler shows (``SchedNode.placed_last``) is
compared with what the lifecycle wants, and only differences are written, so a preference the
scheduler forgot (Slurm drops weights set by scontrol at ``scontrol reconfigure``) comes back on the
next pass, and a controller restart needs no memory of what it set. Nodes gpufleet does not manage
are never touched. Off with ``place_suspects_last = false`` in the policy file, and in dry-run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gpufleet.controller.service import Controller
from gpufleet.domain.errors import Conflict, ExternalError, NotFound
from gpufleet.lifecycle.states import NodeState
from gpufleet.schedulers.port import SchedNode, Scheduler

log = logging.getLogger(__name__)


def place_suspects_last(controller: Controller, scheduler: Scheduler, nodes: Sequence[SchedNode]) -> int:
    """Make ``placed_last`` of ``nodes`` match their lifecycle state; returns how many were changed."""
    if not controller.policy_file.config.place_suspects_last or controller.dry_run:
        return 0
    states = controller.states()
    changed = 0
    for n in nodes:
        state = states.get(n.name)
        if state is None:
            continue
        want = state == NodeState.SUSPECT
        if n.placed_last == want:
            continue
        try:
            scheduler.place_last(n.name, want)
        except (ExternalError, NotFound, Conflict) as err:  # tried again on the next pass
            log.warning("%s: could not %s: %s", n.name, "place it last" if want else "place it normally", err)
            continue
        changed += 1
        detail = ("suspect: placed last for new work (still schedulable)" if want
                  else f"{state}: placed normally again")
        log.info("%s: %s", n.name, detail)
        controller.audit(n.name, "place_last" if want else "place_normally", detail)
    return changed
