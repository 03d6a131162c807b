"""Hot-spare pools per topology domain: which nodes are spares, which are lent, which one replaces a failure. Pure.

A pool (docs/spares.md) covers a set of nodes (a maintenance :class:`Selector`) split into topology
domains (``per``: each node's leaf switch or rack). In each domain it keeps ``count`` nodes (or a
``share`` of the domain) out of the big job's partition as hot spares; a spare is *lent* to the
preemptible backfill partition while nothing needs it, except the ``keep_idle`` spares of each domain,
which are lent to no one (ready at once, nothing to preempt). The other nodes of the pool are the big
partition's *working* nodes.

When a working node fails (out of service in gpufleet, or down/drained in the scheduler), the pass
:func:`plan_pool` picks the spare that replaces it: the nearest one (:func:`distance`: same leaf switch,
then same rack, then anywhere in the pool), idle before lent (nothing to preempt), by name. A reclaim
preempts the spare's sweeps, so it is a disruption like a drain: it is allowed only where the caller's
``breaker(spare, out)`` (lifecycle.breaker's budget, via the engine) allows taking the spare out with
``out`` already out; a spare whose domain's budget is spent is passed over for the next nearest.

Accounting (:class:`PoolCounts`): a domain never has fewer than zero spares, a spare is reclaimed at
most once at a time, and a pool refills (designates idle working nodes as spares) only while none of
its failures waits for a replacement and no replacement is still in progress, so a refill never takes
a node the big job is about to restart on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.fleet import RACK_DOMAIN, SWITCH_DOMAIN
from gpufleet.lifecycle.maintenance import Selector

PER = {"switch": SWITCH_DOMAIN, "rack": RACK_DOMAIN}
NO_DOMAIN = "(no domain)"
ALL = Selector("all")
Breaker = Callable[[str, Set[str]], "str | None"]


class Role(StrEnum):
    """A pool node's role as the store keeps it (a node without a role is a working node)."""

    SPARE = "spare"  # out of the big partition; lent to the backfill partition unless kept idle
    RECLAIMING = "reclaiming"  # chosen to replace a failed node: leaving backfill, its sweeps requeued
    RECLAIMED = "reclaimed"  # in the big partition, replacing a failed node (until that node is back)


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """One ``[[spares.pools]]`` entry (validated here, so the API, the settings and the tests agree)."""

    name: str
    big_partition: str
    backfill_partition: str
    nodes: Selector = ALL
    per: str = "switch"
    count: int | None = None
    share: float | None = None
    keep_idle: int = 0

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name):
            raise InvalidInput("spares.pools.name", self.name, "a name of letters, digits, '-', '_' and '.'")
        for f in ("big_partition", "backfill_partition"):
            v = getattr(self, f)
            if not v or any(c in v for c in ", \t\n="):
                raise InvalidInput(f"spares.pools.{f}", v, "a Slurm partition name")
        if self.big_partition == self.backfill_partition:
            raise InvalidInput("spares.pools.backfill_partition", self.backfill_partition,
                               f"a partition other than the big partition ({self.big_partition})")
        if self.per not in PER:
            raise InvalidInput("spares.pools.per", self.per, "switch (each leaf switch) or rack")
        if (self.count is None) == (self.share is None):
            raise InvalidInput("spares.pools.count", self.count,
                               f"exactly one of count (spares per domain) or share (a fraction of each domain); "
                               f"share is {self.share}")
        if self.count is not None and self.count < 0:
            raise InvalidInput("spares.pools.count", self.count, "a whole number of spares per domain, 0 or more")
        if self.share is not None and not 0 <= self.share < 1:
            raise InvalidInput("spares.pools.share", self.share, "a fraction of each domain, from 0 to below 1")
        if self.keep_idle < 0:
            raise InvalidInput("spares.pools.keep_idle", self.keep_idle, "a whole number of spares, 0 or more")

    def target(self, size: int) -> int:
        """Spares a domain of ``size`` pool nodes keeps (never all of them unless count says so)."""
        if self.count is not None:
            return min(self.count, size)
        assert self.share is not None
        return min(size, math.ceil(self.share * size - 1e-9))

    def domain_of(self, domains: frozenset[str]) -> str:
        """The node's domain for this pool: its (first) leaf switch or rack."""
        prefix = PER[self.per]
        return min((d for d in domains if d.startswith(prefix)), default=NO_DOMAIN)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "nodes": self.nodes.text, "per": self.per, "count": self.count,
                "share": self.share, "keep_idle": self.keep_idle, "big_partition": self.big_partition,
                "backfill_partition": self.backfill_partition}


def distance(a: frozenset[str], b: frozenset[str]) -> int:
    """How far apart two nodes are: 0 behind one leaf switch, 1 in one rack, 2 otherwise."""
    shared = a & b
    if any(d.startswith(SWITCH_DOMAIN) for d in shared):
        return 0
    if any(d.startswith(RACK_DOMAIN) for d in shared):
        return 1
    return 2


@dataclass(frozen=True, slots=True)
class NodeView:
    """What one pass knows of a pool node."""

    domains: frozenset[str]
    healthy: bool  # serving in gpufleet AND up and undrained in the scheduler
    busy: bool  # runs a job now
    unknown: bool = False  # the scheduler cannot say (slurmd not registered yet): not usable, not a failure


@dataclass(frozen=True, slots=True)
class Held:
    """A stored role: ``replaces`` is the failed node a reclaiming/reclaimed spare stands in for."""

    role: Role
    replaces: str = ""


@dataclass(frozen=True, slots=True)
class PoolCounts:
    domain: str
    target: int
    ready: int  # healthy spares with nothing running (kept idle, or lent but unused)
    lent: int  # healthy spares in the backfill partition running sweeps
    reclaiming: int
    reclaimed: int

    @property
    def spares(self) -> int:
        return self.ready + self.lent


@dataclass(frozen=True, slots=True)
class PoolPlan:
    designate: tuple[str, ...] = ()  # working nodes that become spares (a refill)
    reclaim: tuple[tuple[str, str], ...] = ()  # (spare, failed node it replaces), nearest first
    settle: tuple[str, ...] = ()  # reclaimed spares whose failed node is back: they become working nodes
    lend: frozenset[str] = frozenset()  # spares that belong in the backfill partition
    keep: frozenset[str] = frozenset()  # spares kept idle: in neither partition
    waiting: Mapping[str, str] = field(default_factory=dict)  # failed node -> why no spare replaces it


def plan_pool(spec: PoolSpec, views: Mapping[str, NodeView], held: Mapping[str, Held], out: Set[str],
              breaker: Breaker) -> PoolPlan:
    """One pass's decisions for one pool.

    ``views``: the pool's nodes (selected and registered); ``held``: the roles stored for this pool;
    ``out``: every node of the fleet out of service now (the breaker's view); ``breaker(node, out)``:
    why the blast-radius budget forbids disrupting ``node``, or None."""
    held = {n: h for n, h in held.items() if n in views}
    by_dom: dict[str, list[str]] = {}
    for n in sorted(views):
        by_dom.setdefault(spec.domain_of(views[n].domains), []).append(n)
    standing_in = {h.replaces for h in held.values() if h.role != Role.SPARE and h.replaces}

    # Reclaimed spares whose failed node is healthy again are working nodes from now on.
    settle = tuple(n for n, h in sorted(held.items()) if h.role == Role.RECLAIMED
                   and (not h.replaces or h.replaces not in views or views[h.replaces].healthy))
    # Failures: working nodes out of service that no spare stands in for yet.
    failed = [n for n in sorted(views) if not views[n].healthy and not views[n].unknown and n not in standing_in
              and (n not in held or held[n].role == Role.RECLAIMED)]
    spares = {n for n, h in held.items() if h.role == Role.SPARE}
    usable = {n for n in spares if views[n].healthy}
    reclaim: list[tuple[str, str]] = []
    waiting: dict[str, str] = {}
    disrupted = set(out)
    for f in failed:
        pick, why = _nearest(f, usable, views, disrupted, breaker)
        if pick is None:
            waiting[f] = why
            continue
        reclaim.append((pick, f))
        usable.discard(pick)
        disrupted.add(pick)
    taken = {s for s, _ in reclaim}

    # Refill only while nothing waits and no replacement is in progress.
    designate: list[str] = []
    in_progress = any(h.role == Role.RECLAIMING for h in held.values()) or bool(reclaim) or bool(waiting)
    unsettled = any(h.role == Role.RECLAIMED and n not in settle for n, h in held.items())
    lend: set[str] = set()
    keep: set[str] = set()
    for _, members in sorted(by_dom.items()):
        target = spec.target(len(members))
        mine = sorted(n for n in members if n in spares and n not in taken)
        if len(mine) < target and not in_progress and not unsettled:
            fresh = [n for n in reversed(members) if n not in held and n not in taken and views[n].healthy
                     and not views[n].busy][: target - len(mine)]
            designate += fresh
            mine = sorted(mine + fresh)
        # keep_idle: the idle spares first (keeping a busy one idle would wait for its sweep to end)
        kept = sorted(mine, key=lambda n: (views[n].busy, n))[: spec.keep_idle]
        keep.update(kept)
        lend.update(n for n in mine if n not in kept)
    return PoolPlan(tuple(designate), tuple(reclaim), settle, frozenset(lend), frozenset(keep), waiting)


def applied(held: Mapping[str, Held], plan: PoolPlan) -> dict[str, Held]:
    """The roles after ``plan`` is carried out (a reclaim counted as done)."""
    out = {n: h for n, h in held.items() if n not in plan.settle}
    out.update({n: Held(Role.SPARE) for n in plan.designate})
    out.update({s: Held(Role.RECLAIMED, f) for s, f in plan.reclaim})
    return out


def tally(spec: PoolSpec, views: Mapping[str, NodeView], held: Mapping[str, Held]) -> tuple[PoolCounts, ...]:
    """Per domain of the pool: spares kept (target), ready, lent, reclaiming, reclaimed."""
    by_dom: dict[str, list[str]] = {}
    for n in sorted(views):
        by_dom.setdefault(spec.domain_of(views[n].domains), []).append(n)

    def n_of(members: list[str], role: Role, busy: bool | None = None) -> int:
        return sum(1 for n in members if n in held and held[n].role == role
                   and (busy is None or (views[n].healthy and views[n].busy == busy)))

    return tuple(PoolCounts(dom, spec.target(len(ms)), n_of(ms, Role.SPARE, False), n_of(ms, Role.SPARE, True),
                            n_of(ms, Role.RECLAIMING), n_of(ms, Role.RECLAIMED)) for dom, ms in sorted(by_dom.items()))


def _nearest(failed: str, usable: Set[str], views: Mapping[str, NodeView], out: Set[str],
             breaker: Breaker) -> tuple[str | None, str]:
    """The spare that replaces ``failed``: nearest, idle before lent, by name, within the budget."""
    if not usable:
        return None, "no healthy spare left in the pool"
    home = views[failed].domains
    refused = []
    for s in sorted(usable, key=lambda n: (distance(home, views[n].domains), views[n].busy, n)):
        why = breaker(s, out)
        if why is None:
            return s, ""
        refused.append(f"{s}: {why}")
    return None, "every spare is over the blast-radius budget (" + "; ".join(refused[:3]) + ")"
