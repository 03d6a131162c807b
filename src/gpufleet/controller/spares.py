"""Hot-spare pools, carried out on Slurm: designate, lend, reclaim (docs/spares.md, decision 0081).

One pass (:meth:`Spares.on_pass`, called by the reconciler after its actions) reads Slurm's nodes once
(``sinfo --json``: state and partitions), asks the pure core (``lifecycle.spares.plan_pool``) what each
pool should do, and does it through the Slurm adapter. The lever is **partition membership**
(``scontrol update partitionname=P nodes=...``): a spare is out of the big partition, in the backfill
partition while lent (out of it while kept idle); a reclaimed spare is in the big partition and out of
the backfill one. Partition membership needs nothing of the jobs (no ``--constraint``) and keeps the big
partition's own jobs off the spares; Slurm forgets it at ``scontrol reconfigure``, so every pass sets
the membership the pools want again when it differs (like ``place_last``'s weights).

A reclaim (a working node failed; the nearest spare within the blast-radius budget replaces it) is a
sequence of steps, each recorded with its audit line **after** it is done and each idempotent by
observation, so a controller stopped anywhere resumes and does nothing twice:

1. ``reclaiming`` recorded (the choice: spare, failed node);
2. the spare leaves the backfill partition (no new sweep lands on it) -> step ``backfill_left``;
3. the backfill jobs *running on the spare* are requeued (``scontrol requeue``: the same REQUEUE that
   Slurm's partition preemption does) -> step ``requeued``. Resumed, this step finds the requeued sweeps
   pending or running elsewhere (the spare left the backfill partition first): none is requeued twice;
4. the spare joins the big partition -> role ``reclaimed``, step ``joined``. The big job, requeued by
   the failed node's drain or resubmitted, can start at full size.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from gpufleet.domain.errors import ExternalError, GpufleetError, InvalidInput
from gpufleet.lifecycle.engine import NodeRecord
from gpufleet.lifecycle.plan import AuditEntry
from gpufleet.lifecycle.spares import NodeView, PoolCounts, PoolPlan, PoolSpec, Role, plan_pool, tally
from gpufleet.lifecycle.states import SCHEDULABLE, Actor, NodeState
from gpufleet.schedulers.port import Job, JobState, SchedNodeState
from gpufleet.schedulers.slurm.parse import SlurmNode

from .service import Controller
from .store.spares import SpareNode, SpareStore

log = logging.getLogger(__name__)
_SERVING = frozenset({SchedNodeState.IDLE, SchedNodeState.ALLOCATED})
BACKFILL_LEFT, REQUEUED, JOINED = "backfill_left", "requeued", "joined"


@runtime_checkable
class PartitionLever(Protocol):
    """What the pools need of the scheduler (schedulers.slurm.SlurmScheduler has it)."""

    def slurm_nodes(self) -> list[SlurmNode]: ...

    def jobs_on(self, node: str) -> Sequence[Job]: ...

    def requeue(self, job_id: str) -> None: ...

    def set_partition_nodes(self, partition: str, nodes: Sequence[str]) -> None: ...


@dataclass
class PoolStatus:
    spec: PoolSpec
    plan: PoolPlan | None = None
    views: Mapping[str, NodeView] | None = None  # the pool's nodes as the last pass saw them
    note: str = ""  # why the last pass did not plan this pool (an unreadable scheduler, a bad selector)


class Spares:
    def __init__(self, controller: Controller, lever: PartitionLever, pools: Sequence[PoolSpec]) -> None:
        self.controller, self.lever = controller, lever
        self.store = SpareStore(controller.store)
        self.pools = {p.name: PoolStatus(p) for p in pools}
        self.last_pass: datetime | None = None
        self._lock = threading.Lock()
        self._members: dict[str, set[str]] = {}  # partition -> nodes, this pass (updated by our own writes)

    # ---- the pass ---------------------------------------------------------------------------
    def on_pass(self) -> None:
        if not self.pools:
            return
        with self._lock:
            try:
                nodes = {n.name: n for n in self.lever.slurm_nodes()}
            except ExternalError as err:  # fail closed: nothing is lent, reclaimed or moved blind
                for st in self.pools.values():
                    st.note = f"scheduler unreadable: {err}"
                return
            self._members = {}
            for n in nodes.values():
                for p in n.partitions:
                    self._members.setdefault(p, set()).add(n.name)
            claimed: set[str] = set()
            for st in self.pools.values():
                try:
                    claimed |= self._pool(st, nodes, claimed)
                    st.note = ""
                except GpufleetError as err:  # the scheduler, the database, a bad selector
                    st.note = str(err)
                    log.warning("spares %s: %s; trying again on the next pass", st.spec.name, err)
                except Exception as err:  # never let one pool stop the others or the reconciler's pass
                    st.note = f"pass failed: {err}"
                    log.exception("spares %s: pass failed; trying again on the next pass", st.spec.name)
            self.last_pass = self.controller.clock.now()

    def _pool(self, st: PoolStatus, sched: Mapping[str, SlurmNode], claimed: Set[str]) -> set[str]:
        spec = st.spec
        rows = {r.node: r for r in self.store.all()}
        with self.controller.lock:
            engine = self.controller.engine
            recs = {n: r for n, r in engine.nodes.items() if r.state != NodeState.RETIRED}
            domains = {n: r.domains for n, r in recs.items()}
            try:
                selected = spec.nodes.select(domains)
            except InvalidInput as err:
                raise InvalidInput(f"spares.pools[{spec.name}].nodes", spec.nodes.text, err.expected) from None
            # a node of another pool (an earlier one in the config, or one that holds it) is not this pool's
            mine = [n for n in selected if n in sched and n not in claimed
                    and (n not in rows or rows[n].pool == spec.name or rows[n].pool not in self.pools)]
            views = {n: _view(recs[n], sched[n]) for n in mine}
            out = engine.unavailable() | {n for n, s in sched.items() if n in recs and s.state not in _SERVING}
            held = {n: r.held for n, r in rows.items() if r.pool == spec.name and n in views}
            plan = plan_pool(spec, views, held, out, engine.budget_violation)
        before = st.plan.waiting if st.plan is not None else {}
        st.plan, st.views = plan, views
        for f, why in plan.waiting.items():
            if before.get(f) != why:  # once per new reason, not every pass
                log.warning("spares %s: %s failed and no spare replaces it: %s", spec.name, f, why)
        for n in plan.settle:
            self.store.drop(n, self._audit(spec, "spare_settled", n, f"{held[n].replaces or 'its failed node'} is "
                                           f"back: {n} stays in {spec.big_partition} as a working node"))
        for n in plan.designate:
            self.store.put(n, spec.name, Role.SPARE, self._now(), self._audit(
                spec, "spare_designate", n, f"hot spare of {spec.domain_of(views[n].domains)}: out of "
                f"{spec.big_partition}, lent to {spec.backfill_partition} while idle"))
        for s, f in plan.reclaim:
            self.store.put(s, spec.name, Role.RECLAIMING, self._now(), self._audit(
                spec, "spare_reclaim", s, f"replaces {f} (failed) in {spec.big_partition}: leaving "
                f"{spec.backfill_partition}, its sweeps requeued"), replaces=f)
            log.warning("spares %s: %s failed: reclaiming %s", spec.name, f, s)
        for r in self.store.all():
            if r.pool == spec.name and r.role == Role.RECLAIMING and r.node in views:
                self._reclaim(spec, r)
        self._membership(spec, set(views))
        return set(views)

    def _reclaim(self, spec: PoolSpec, r: SpareNode) -> None:
        """Carry a reclaim on from its last recorded step (each step is a no-op when already done)."""
        step = r.step
        if step == "":
            self._set(spec.backfill_partition, remove={r.node})
            step = self._step(spec, r, BACKFILL_LEFT, f"left {spec.backfill_partition}: no new sweep lands on it")
        if step == BACKFILL_LEFT:
            victims = [j for j in self.lever.jobs_on(r.node) if j.state == JobState.RUNNING and r.node in j.nodes
                       and dict(j.extra).get("partition") == spec.backfill_partition]
            for j in victims:
                self.lever.requeue(j.id)
            detail = (f"preempted (requeued) {', '.join(j.id for j in victims)} of {spec.backfill_partition}"
                      if victims else "no sweep was running on it")
            step = self._step(spec, r, REQUEUED, detail, action="spare_preempt")
        if step == REQUEUED:
            self._set(spec.big_partition, add={r.node})
            self.store.put(r.node, spec.name, Role.RECLAIMED, self._now(), self._audit(
                spec, "spare_reclaimed", r.node, f"joined {spec.big_partition} in place of {r.replaces}"),
                replaces=r.replaces, step=JOINED, detail=f"in {spec.big_partition} in place of {r.replaces}")
            log.warning("spares %s: %s joined %s in place of %s", spec.name, r.node, spec.big_partition, r.replaces)

    def _step(self, spec: PoolSpec, r: SpareNode, step: str, detail: str, action: str = "spare_reclaim_step") -> str:
        self.store.put(r.node, spec.name, Role.RECLAIMING, self._now(),
                       self._audit(spec, action, r.node, f"reclaim for {r.replaces}: {detail}"),
                       replaces=r.replaces, step=step, detail=detail)
        return step

    def _membership(self, spec: PoolSpec, pool: set[str]) -> None:
        """Set the partitions' node lists the pool wants where Slurm's differ (a reconfigure forgets ours)."""
        roles = {r.node: r for r in self.store.all() if r.pool == spec.name and r.node in pool}
        st = self.pools[spec.name]
        lend = st.plan.lend if st.plan is not None else frozenset()
        out_of_big = {n for n, r in roles.items() if r.role in (Role.SPARE, Role.RECLAIMING)}
        self._want(spec, spec.big_partition, pool, pool - out_of_big)
        # the backfill partition: spares lent are in, spares kept idle and reclaimed ones are out;
        # working nodes keep whatever membership the site gave them
        self._want(spec, spec.backfill_partition, set(roles), {n for n in roles if n in lend
                                                               and roles[n].role == Role.SPARE})

    def _want(self, spec: PoolSpec, partition: str, pool: set[str], want: set[str]) -> None:
        current = self._members.get(partition, set())
        if current & pool == want:
            return
        added, removed = sorted(want - current), sorted((current & pool) - want)
        self._set(partition, add=set(added), remove=set(removed))
        detail = " ".join(x for x in (f"+{','.join(added)}" if added else "",
                                      f"-{','.join(removed)}" if removed else "") if x)
        self.store.audit(self._audit(spec, "spare_partition", partition, detail))

    def _set(self, partition: str, *, add: Set[str] = frozenset(), remove: Set[str] = frozenset()) -> None:
        current = self._members.get(partition, set())
        new = (current | add) - remove
        if new == current:
            return
        self.lever.set_partition_nodes(partition, sorted(new))
        self._members[partition] = set(new)

    # ---- status -----------------------------------------------------------------------------
    def status(self) -> list[dict[str, Any]]:
        rows = self.store.all()
        out: list[dict[str, Any]] = []
        for name, st in self.pools.items():
            plan = st.plan
            held = {r.node: r.held for r in rows if r.pool == name}
            counts = [_counts(c) for c in tally(st.spec, st.views or {}, held)]
            totals = {k: sum(int(str(c[k])) for c in counts) for k in ("target", "ready", "lent", "reclaiming",
                                                                    "reclaimed")}
            out.append({"pool": name, "spec": st.spec.as_dict(), "note": st.note, "totals": totals,
                        "domains": counts, "waiting": dict(plan.waiting) if plan else {},
                        "nodes": [{"node": r.node, "role": r.role.value, "replaces": r.replaces, "step": r.step,
                                   "since": r.since.isoformat(), "detail": r.detail}
                                  for r in rows if r.pool == name],
                        "last_pass": self.last_pass.isoformat() if self.last_pass else None})
        return out

    # ---- helpers ----------------------------------------------------------------------------
    def _now(self) -> datetime:
        return self.controller.clock.now()

    def _audit(self, spec: PoolSpec, action: str, target: str, detail: str) -> AuditEntry:
        return AuditEntry(self._now(), Actor.SYSTEM, f"spares:{spec.name}", action, target, detail)


def _view(rec: NodeRecord, node: SlurmNode) -> NodeView:
    serving = rec.state in SCHEDULABLE and not rec.committed
    return NodeView(rec.domains, serving and node.state in _SERVING, node.busy,
                    unknown=serving and node.state == SchedNodeState.UNKNOWN)


def _counts(c: PoolCounts) -> dict[str, object]:
    return {"domain": c.domain, "target": c.target, "ready": c.ready, "lent": c.lent, "reclaiming": c.reclaiming,
            "reclaimed": c.reclaimed}
