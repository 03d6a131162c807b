"""What each page of the web UI shows, read through the same store and controller paths as the API.

Nothing here queries the database itself: every read is a :class:`Store` method the API (or the
reconciler) uses too, so a page and ``/v1`` cannot disagree about a fact. The functions return plain
values for the templates; they change nothing.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from gpufleet.controller.reconciler import Reconciler
from gpufleet.controller.service import Controller
from gpufleet.controller.slots import Missing
from gpufleet.controller.store.models import ActionRow, DecisionRow, EventRow, NodeRow, TransitionRow
from gpufleet.controller.store.repo import Page
from gpufleet.correlate.model import Suspect
from gpufleet.domain.errors import GpufleetError, NotFound
from gpufleet.domain.fleet import SWITCH_DOMAIN, ComponentKind
from gpufleet.domain.inventory import NodeInventory
from gpufleet.lifecycle.decisions import DecisionStatus
from gpufleet.schedulers.port import Job

_ALL = 1000  # the store's page size for "everything" (the API's own largest page)
HELD = DecisionStatus.HELD.value


def _every_node(c: Controller) -> list[NodeRow]:
    rows: list[NodeRow] = []
    while True:
        page = c.store.nodes(page=Page(_ALL, len(rows)))
        rows += page
        if len(page) < _ALL:
            return rows


def held_decisions(c: Controller) -> list[DecisionRow]:
    return c.store.decisions(status=HELD, page=Page(_ALL))


# ---- the fleet map ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Tile:
    node: str
    state: str
    since: datetime
    why: str
    held: bool
    has_jobs: bool
    last_heartbeat: datetime | None


@dataclass(frozen=True, slots=True)
class Rack:
    name: str
    tiles: tuple[Tile, ...]


@dataclass(frozen=True, slots=True)
class SwitchDomain:
    """Nodes whose NICs land on the same set of leaf switches (a scalable unit, on a rail-optimised fabric)."""

    switches: tuple[str, ...]
    racks: tuple[Rack, ...]

    @property
    def label(self) -> str:
        if not self.switches:
            return "no leaf switch registered"
        if len(self.switches) <= 3:
            return ", ".join(self.switches)
        return f"{self.switches[0]} … {self.switches[-1]} ({len(self.switches)} leaf switches)"


@dataclass(frozen=True, slots=True)
class FleetMap:
    domains: tuple[SwitchDomain, ...]
    states: dict[str, int]
    nodes: int
    held: int


def switches(domains: Sequence[str]) -> tuple[str, ...]:
    """The leaf switches among a node's failure domains (Node.domains)."""
    return tuple(sorted(d.removeprefix(SWITCH_DOMAIN) for d in domains if d.startswith(SWITCH_DOMAIN)))


def why(last: TransitionRow | None, decided: TransitionRow | None, held: DecisionRow | None) -> str:
    """Why a node is where it is: a held decision first; else its latest transition, and when that was a
    follow-up step (a drain completing) the decision that started it."""
    if held is not None:
        return f"held by the breaker: {held.reason}"
    if last is None:
        return ""
    if decided is not None and decided.seq != last.seq and decided.reason != last.reason:
        return f"{decided.reason} ({last.reason})"
    return last.reason


def fleet_map(c: Controller) -> FleetMap:
    rows = _every_node(c)
    last, decided = c.store.last_transitions(), c.store.last_transitions(decided=True)
    held = {d.node: d for d in held_decisions(c)}
    grouped: dict[tuple[str, ...], dict[str, list[Tile]]] = defaultdict(lambda: defaultdict(list))
    states: dict[str, int] = defaultdict(int)
    for r in rows:
        states[r.state] += 1
        reason = why(last.get(r.id), decided.get(r.id), held.get(r.id))
        grouped[switches(r.domains)][r.rack].append(Tile(r.id, r.state, r.since, reason, r.id in held, r.has_jobs,
                                                         r.last_heartbeat))
    domains = tuple(SwitchDomain(sw, tuple(Rack(name, tuple(tiles)) for name, tiles in sorted(racks.items())))
                    for sw, racks in sorted(grouped.items(), key=lambda kv: (not kv[0], kv[0])))
    return FleetMap(domains, dict(sorted(states.items())), len(rows), len(held))


# ---- a node ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Sighting:
    """An event and the sightings of the same fault by other sources that were merged onto it."""

    event: EventRow
    merged: tuple[EventRow, ...] = ()


@dataclass(frozen=True, slots=True)
class NodePage:
    node: NodeRow
    why: str
    held: DecisionRow | None
    history: list[TransitionRow]
    events: list[Sighting]
    decisions: list[DecisionRow]
    actions: list[ActionRow]
    checks: list[EventRow]
    verdicts: list[Suspect]
    inventory: NodeInventory | None
    placement: tuple[Mapping[int, str | None], Mapping[str, str | None], tuple[Missing, ...]] = ({}, {}, ())


def node_page(c: Controller, node: str) -> NodePage:
    row = c.store.node(node)
    if row is None:
        raise NotFound("node", node)
    history = c.store.transitions(node, limit=100)
    decisions = c.store.decisions(node=node, page=Page(100))
    checks = sorted(c.store.events(node=node, kind="check_failed", page=Page(25))
                    + c.store.events(node=node, kind="check_passed", page=Page(25)),
                    key=lambda e: (e.time, e.seq), reverse=True)
    held = next((d for d in decisions if d.status == HELD), None)
    reason = why(history[0] if history else None, next((t for t in history if t.decision_id), None), held)
    with c.lock:  # the identity changes under ingest: the slots and the inventory they are of, read together
        placement, inventory = c.identity.placement(node), c.store.inventory(node)
    return NodePage(row, reason, held, history, merged_events(c.store.events(node=node, page=Page(100))), decisions,
                    c.store.actions(node=node, page=Page(100)), checks, verdicts_naming(c, node), inventory, placement)


def merged_events(events: Sequence[EventRow]) -> list[Sighting]:
    """Each event with the later sightings merged onto it (``fault_of``); a sighting whose first report
    is not in ``events`` stands on its own."""
    ids = {e.id for e in events}
    merged: dict[str, list[EventRow]] = defaultdict(list)
    for e in events:
        if e.fault_of and e.fault_of in ids:
            merged[e.fault_of].append(e)
    return [Sighting(e, tuple(merged.get(e.id, ()))) for e in events if not (e.fault_of and e.fault_of in ids)]


def verdicts_naming(c: Controller, node: str) -> list[Suspect]:
    """The current verdicts that blame ``node`` or a part of it, or count it among the nodes affected."""
    topo = c.topology
    return [s for s in verdicts(c) if node in s.affected_nodes or s.component == node
            or (topo is not None and topo.node_of(s.component) == node)]


def verdicts(c: Controller) -> list[Suspect]:
    return sorted(c.verdicts, key=lambda s: -s.confidence)  # as GET /v1/verdicts ranks them


# ---- held decisions --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class HeldGroup:
    """Held decisions approved together: one correlation verdict's nodes (``correlate:<component>``), or
    one node's own decision."""

    actor_id: str
    decisions: tuple[DecisionRow, ...]

    @property
    def component(self) -> str:
        return self.actor_id.removeprefix("correlate:") if self.actor_id.startswith("correlate:") else ""


def held_groups(c: Controller) -> list[HeldGroup]:
    groups: dict[str, list[DecisionRow]] = defaultdict(list)
    singles: list[HeldGroup] = []
    for d in sorted(held_decisions(c), key=lambda d: (d.time, d.node)):
        if d.actor_id.startswith("correlate:"):
            groups[d.actor_id].append(d)
        else:
            singles.append(HeldGroup(d.actor_id, (d,)))
    return [HeldGroup(a, tuple(ds)) for a, ds in sorted(groups.items())] + singles


# ---- jobs ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class JobView:
    job: Job
    last_checkpoint: datetime | None
    age: timedelta | None
    node_states: dict[str, str]


@dataclass(frozen=True, slots=True)
class Jobs:
    jobs: list[JobView] = field(default_factory=list)
    error: str = ""
    total: int = 0  # jobs the scheduler listed
    matched: int = 0  # of those, matching ``find``
    find: str = ""


JOBS_SHOWN = 200  # rows on the jobs page: a big cluster's queue holds 100,000 jobs


def jobs(c: Controller, reconciler: Reconciler | None, find: str = "", limit: int = JOBS_SHOWN) -> Jobs:
    """The scheduler's jobs whose id or name contains ``find`` (any case), running first, at most
    ``limit`` of them, each with its latest checkpoint: the later of what the scheduler says and what
    the job reported to ``POST /v1/jobs/{id}/checkpoint`` (the reconciler reads it the same way)."""
    if reconciler is None:
        return Jobs(error="no scheduler is configured", find=find)
    needle = find.strip().lower()
    seen = [0, 0]  # jobs listed, of which matched

    def matching() -> Iterator[Job]:
        for j in reconciler.scheduler.list_jobs():
            seen[0] += 1
            if not needle or needle in j.id.lower() or needle in (j.name or "").lower():
                seen[1] += 1
                yield j

    try:  # the queue is streamed (decision 0102): only the ``limit`` shown are kept
        # running first, then by id in numeric order for numeric ids (Slurm's): 9 before 10
        shown = heapq.nsmallest(limit, matching(), key=lambda j: (j.state != "running", len(j.id), j.id))
    except GpufleetError as err:
        return Jobs(error=f"the scheduler did not answer: {err}", find=find)
    total, matched = seen
    reported = c.store.last_checkpoints([j.id for j in shown])
    on = sorted({n for j in shown for n in j.nodes})  # the shown jobs' nodes, not the fleet's
    states = {n.id: n.state for n in c.store.nodes(within=on, page=Page(max(1, len(on))))}
    now = c.clock.now()
    out = []
    for j in shown:
        times = [t for t in (j.last_checkpoint, reported.get(j.id)) if t is not None]
        last = max(times) if times else None
        out.append(JobView(j, last, now - last if last else None, {n: states.get(n, "unknown") for n in j.nodes}))
    return Jobs(out, total=total, matched=matched, find=find)


def inventory_rows(page: NodePage) -> dict[str, list[dict[str, Any]]]:
    """The inventory's GPUs and HCAs, each with the slot the controller names it by (a unit missing from
    the inventory shifts the agent's numbering: decision 0133), and the units missing from it."""
    inv = page.inventory
    doc = inv.to_json() if inv is not None else {"gpus": [], "nics": []}
    gpu_slot, nic_slot, missing = page.placement
    return {"gpus": [{**g, "slot": gpu_slot.get(g["index"])} for g in doc["gpus"]],
            "nics": [{**n, "slot": nic_slot.get(n["device"])} for n in doc["nics"]],
            "missing": [{"kind": "GPU" if m.kind is ComponentKind.GPU else "HCA", "slot": m.slot, "pci": m.pci,
                         "serial": m.serial} for m in missing]}
