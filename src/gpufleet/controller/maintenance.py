"""Protected rolling maintenance, carried out: the rollouts' runner (docs/maintenance.md).

One pass (:meth:`Maintenance.on_pass`, called by the reconciler after its actions) moves every node of
every active rollout one step on, then — while a rollout runs — starts the pending nodes that fit the
budget (``lifecycle.maintenance.admit``). Per node, everything goes through the machinery that exists:

* **draining**: ``LifecycleEngine.maintenance_drain`` — a ``drain_after_checkpoint`` action, so the
  reconciler asks the node's job to checkpoint (decisions 0010/0011) and drains it through the
  scheduler adapter; the node is ``drained`` once the scheduler reports it drained and empty.
* **action**: only on a node gpufleet has drained AND the scheduler shows without jobs (fail closed:
  an unreadable scheduler waits). The node moves drained -> repair and the action is queued on the
  agent command channel under the key ``maint:<rollout>:<node>`` (recorded first): queued once, run at
  most once by the agent (its journal), however often the controller restarts.
* **validating**: the action worked -> ``repair_succeeded``: revalidate with a validation job
  (``[validation]``); a pass returns the node to service (resume), a fail sends it back to repair.
* A failed or timed-out action leaves the node in repair (never returned to service); with
  ``on_failure = stop`` the rollout stops.

Every step is written with its audit line in one transaction (store.maintenance); the runner keeps no
state of its own but the last pass's "why waiting" notes, so a restarted controller resumes from the store.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from gpufleet.controller.executors.bmc import BmcExecutor
from gpufleet.controller.pxe import PxeAction
from gpufleet.controller.service import Controller
from gpufleet.controller.store.maintenance import MaintenanceStore, NodeStep, Rollout
from gpufleet.controller.store.repairs import CommandStatus, RepairStore
from gpufleet.domain.errors import Conflict, ExternalError, GpufleetError, InvalidInput, NotFound
from gpufleet.lifecycle.engine import OperatorOp
from gpufleet.lifecycle.maintenance import (
    FINISHED,
    IN_FLIGHT,
    PXE,
    OnFailure,
    RolloutState,
    Spec,
    Step,
    admit,
    waves,
)
from gpufleet.lifecycle.plan import AuditEntry
from gpufleet.lifecycle.states import SCHEDULABLE, Actor, NodeState
from gpufleet.schedulers.port import SchedNodeState, Scheduler

log = logging.getLogger(__name__)
R = RolloutState
_SERVING = frozenset({SchedNodeState.IDLE, SchedNodeState.ALLOCATED})
_BACK = frozenset({NodeState.READY, NodeState.IN_SERVICE})


def command_key(rollout: str, node: str) -> str:
    return f"maint:{rollout}:{node}"


class Maintenance:
    def __init__(self, controller: Controller, scheduler: Scheduler, bmc: BmcExecutor | None = None) -> None:
        self.controller, self.scheduler = controller, scheduler
        self.pxe = PxeAction(controller, bmc)  # the ``pxe`` action: out of band, not on the agent channel
        self.store = MaintenanceStore(controller.store)
        self.repairs = RepairStore(controller.store)
        self.waiting: dict[str, Mapping[str, str]] = {}  # rollout -> node -> why it has not started (last pass)
        self.last_pass: datetime | None = None
        self._lock = threading.Lock()  # one pass or one operator call at a time

    def load(self) -> None:
        """After a (re)start: the nodes rollouts hold are skipped by the time-driven rules."""
        held = self.store.held_nodes()
        with self.controller.lock:
            self.controller.under_maintenance = held

    # ---- operators --------------------------------------------------------------------------
    def plan(self, body: Mapping[str, Any], actor: str) -> Rollout:
        """Create a rollout (planned: nothing happens until :meth:`start`). InvalidInput names a bad field."""
        spec = Spec.of_dict(body)
        with self.controller.lock:
            domains = {n: r.domains for n, r in self.controller.engine.nodes.items()
                       if r.state != NodeState.RETIRED}
        nodes = spec.selector.select(domains)
        if spec.action == PXE:  # out of band: refused now rather than after draining the nodes
            bmc = self.pxe.bmc
            missing = [n for n in nodes if bmc is None or not bmc.has(n)]
            if missing:
                raise InvalidInput("action", spec.action, f"nodes with a BMC in [repair] bmc_file for a pxe rollout "
                                   f"({len(missing)} of {len(nodes)} have none: {', '.join(missing[:5])}"
                                   f"{', ...' if len(missing) > 5 else ''})")
        rid = f"m-{uuid.uuid4().hex[:10]}"
        now = self.controller.clock.now()
        detail = (f"planned {spec.action} of {len(nodes)} node(s) ({spec.selector.text}), max_unavailable "
                  f"{spec.max_unavailable}, per domain {spec.max_unavailable_domain}, on_failure {spec.on_failure}")
        with self._lock:
            return self.store.create(rid, spec, nodes, actor, now, self._audit(rid, "maintenance_plan", detail, actor))

    def start(self, rid: str, actor: str) -> Rollout:
        with self._lock:
            return self.store.set_state(rid, R.RUNNING, "", self.controller.clock.now(),
                                        self._audit(rid, "maintenance_start", "started", actor),
                                        expect=(R.PLANNED, R.PAUSED, R.STOPPED))

    def pause(self, rid: str, actor: str, reason: str = "") -> Rollout:
        why = reason or "paused by operator"
        with self._lock:
            return self.store.set_state(rid, R.PAUSED, why, self.controller.clock.now(),
                                        self._audit(rid, "maintenance_pause", why, actor), expect=(R.RUNNING,))

    def abort(self, rid: str, actor: str, reason: str = "") -> Rollout:
        why = reason or "aborted by operator"
        now = self.controller.clock.now()
        with self._lock:
            r = self.store.set_state(rid, R.ABORTING, why, now, self._audit(rid, "maintenance_abort", why, actor),
                                     expect=(R.PLANNED, R.RUNNING, R.PAUSED, R.STOPPED))
            n = self.store.skip_pending(rid, f"rollout aborted: {why}", now, self._audit(
                rid, "maintenance_skip", "pending nodes skipped: the rollout was aborted", actor))
            log.warning("maintenance %s aborted by %s (%s): %d pending node(s) skipped", rid, actor, why, n)
            return self._aborted(self.store.get(r.id))

    def _aborted(self, r: Rollout) -> Rollout:
        """An aborting rollout with no node in flight any more is aborted (the runner stops looking at it)."""
        if r.state != R.ABORTING or r.at(*IN_FLIGHT):
            return r
        return self.store.set_state(r.id, R.ABORTED, r.reason, self.controller.clock.now(),
                                    self._audit(r.id, "maintenance_aborted", "no node in flight any more"))

    def preview(self, r: Rollout) -> list[list[str]]:
        """The batches the rest of ``r`` would run in if nothing else changed (``lifecycle.maintenance.waves``)."""
        with self.controller.lock:
            domains = {n: rec.domains for n, rec in self.controller.engine.nodes.items()}
            unavailable = self.controller.engine.unavailable()
            left = [n.node for n in r.at(Step.PENDING) if n.node in domains]
            return waves(left, unavailable, domains, r.spec, self.controller.engine.budget_violation)

    # ---- the pass ---------------------------------------------------------------------------
    def on_pass(self) -> None:
        with self._lock:
            active = self.store.list(active_only=True)
            for r in active:
                try:
                    self._advance(r)
                except GpufleetError as err:  # the scheduler, the database, a node that moved meanwhile
                    log.warning("maintenance %s: %s; trying again on the next pass", r.id, err)
                except Exception:  # never let one rollout stop the others or the reconciler's pass
                    log.exception("maintenance %s: pass failed; trying again on the next pass", r.id)
            self.last_pass = self.controller.clock.now()
            if active or self.controller.under_maintenance:
                self.load()

    def _advance(self, r: Rollout) -> None:
        failed = []
        for n in r.at(*IN_FLIGHT):
            if self._node(r, n) == Step.FAILED:
                failed.append(n.node)
        r = self.store.get(r.id)
        now = self.controller.clock.now()
        if failed and r.state == R.RUNNING and r.spec.on_failure == OnFailure.STOP:
            why = f"{', '.join(failed)} failed: stopped (on_failure = stop); start it again to go on"
            r = self.store.set_state(r.id, R.STOPPED, why, now, self._audit(r.id, "maintenance_stop", why))
            log.error("maintenance %s: %s", r.id, why)
        if r.state == R.RUNNING:
            self._admit(r)
            r = self.store.get(r.id)
        if r.state == R.ABORTING:
            self._aborted(r)
            return
        if r.state in (R.RUNNING, R.STOPPED) and all(n.step in FINISHED for n in r.nodes):
            counts = {s: len(r.at(s)) for s in FINISHED}
            detail = ", ".join(f"{c} {s}" for s, c in counts.items() if c)
            self.store.set_state(r.id, R.DONE, detail, now, self._audit(r.id, "maintenance_done", detail))

    def _node(self, r: Rollout, n: NodeStep) -> Step:
        """Move one in-flight node on; returns its step afterwards."""
        try:
            state = self.controller.state_of(n.node)
        except NotFound:
            return self._step(r, n, Step.FAILED, "node no longer registered")
        if n.step == Step.DRAINING:
            return self._draining(r, n, state)
        if n.step == Step.ACTION:
            return self._action(r, n, state)
        return self._validating(r, n, state)

    def _draining(self, r: Rollout, n: NodeStep, state: NodeState) -> Step:
        now = self.controller.clock.now()
        if state in SCHEDULABLE:  # recorded as draining, the drain decision not yet (a crash in between)
            if r.state == R.ABORTING:
                return self._step(r, n, Step.SKIPPED, "rollout aborted before the drain")
            try:
                self.controller.maintenance_drain(n.node, r.id, r.actor)
            except Conflict as err:
                return self._step(r, n, Step.PENDING, f"back to pending: {err}")
            return n.step
        if state == NodeState.DRAINING:
            if now - n.since > r.spec.drain_timeout:
                return self._step(r, n, Step.FAILED, f"not drained within {r.spec.drain_timeout}: it stays out "
                                  "of service (draining); the action was not run")
            return n.step
        if state != NodeState.DRAINED:
            return self._step(r, n, Step.FAILED, f"is {state} (taken by something else while draining): "
                              "the action was not run")
        if r.state == R.ABORTING:  # drained but not acted on: back to service through revalidation
            self.controller.operate(n.node, OperatorOp.RESUME, f"maintenance:{r.id}",
                                    f"maintenance {r.id} aborted before its action")
            return self._step(r, n, Step.SKIPPED, "rollout aborted before the action: revalidated, then returned")
        if r.state != R.RUNNING:
            return n.step  # paused or stopped: drained, the action waits
        try:
            jobs = self.scheduler.jobs_on(n.node)
        except ExternalError as err:
            log.warning("maintenance %s: %s: cannot read its jobs (%s): the action waits", r.id, n.node, err)
            return n.step
        if jobs:  # fail closed: never run the action under a job
            log.warning("maintenance %s: %s is drained but runs %s: the action waits", r.id, n.node,
                        ", ".join(j.id for j in jobs))
            return n.step
        key = command_key(r.id, n.node)
        self._step(r, n, Step.ACTION, f"{r.spec.action} queued for the node's agent ({key})", command=key)
        return self._action(r, self.store.get(r.id).node(n.node), state)

    def _action(self, r: Rollout, n: NodeStep, state: NodeState) -> Step:
        now = self.controller.clock.now()
        key = n.command or command_key(r.id, n.node)
        if state == NodeState.DRAINED:
            self.controller.maintenance_work(n.node, f"maintenance {r.id}: {r.spec.action}", f"maintenance:{r.id}")
        if r.spec.action == PXE:
            return self.pxe.advance(r, n, key, lambda step, detail, command=None: self._step(
                r, n, step, detail, command=command))
        cmd = self.repairs.command(key)
        if cmd is None:  # queued once under its key; the agent's journal runs it at most once
            self.repairs.enqueue(key, n.node, r.spec.action, now)
            cmd = self.repairs.command(key)
        if cmd is not None and cmd.status == CommandStatus.QUEUED and now - n.since > r.spec.action_timeout:
            cmd = self.repairs.expire(key, now)
        if cmd is None or cmd.status == CommandStatus.QUEUED:
            return n.step
        if cmd.status != CommandStatus.SUCCEEDED:
            detail = cmd.detail or cmd.status
            return self._step(r, n, Step.FAILED, f"{r.spec.action} {cmd.status}: {detail}; the node stays in "
                              "repair, out of service")
        self.controller.repair_succeeded(n.node, f"maintenance {r.spec.action}", r.spec.validate, key)
        return self._step(r, n, Step.VALIDATING, f"{r.spec.action} succeeded ({cmd.detail}); "
                          f"{r.spec.validate} validation before service")

    def _validating(self, r: Rollout, n: NodeStep, state: NodeState) -> Step:
        if state in _BACK:
            return self._step(r, n, Step.DONE, "validated and back in service")
        if state == NodeState.REVALIDATE:
            if self.controller.clock.now() - n.since > r.spec.validate_timeout:
                return self._step(r, n, Step.FAILED, f"no validation verdict within {r.spec.validate_timeout}: "
                                  "it stays out of service (revalidate)")
            return n.step
        return self._step(r, n, Step.FAILED, f"validation failed: the node is {state}, out of service")

    def _admit(self, r: Rollout) -> None:
        try:
            sched = {s.name: s.state for s in self.scheduler.list_nodes()}
        except ExternalError as err:  # fail closed: what is out is unknown, so nothing starts
            self.waiting[r.id] = {n.node: f"scheduler unreadable: {err}" for n in r.at(Step.PENDING)}
            return
        with self.controller.lock:
            engine = self.controller.engine
            recs = {n: engine.nodes[n] for n in (x.node for x in r.at(Step.PENDING)) if n in engine.nodes}
            # Every registered node out for any reason: gpufleet's view, and the scheduler's (a node an
            # admin drained, or one that is down, is out even where gpufleet has not noticed yet).
            unavailable = engine.unavailable() | {n for n, st in sched.items()
                                                   if n in engine.nodes and st not in _SERVING
                                                   and engine.nodes[n].state != NodeState.RETIRED}
            domains = {n: rec.domains for n, rec in engine.nodes.items() if rec.state != NodeState.RETIRED}
            held = set(engine.held)
        order = []
        for x in r.at(Step.PENDING):
            rec = recs.get(x.node)
            if rec is None or rec.state not in SCHEDULABLE or rec.committed or x.node in held:
                why = "not registered" if rec is None else "held by the breaker" if x.node in held else (
                    f"{rec.state}{' and committed to a drain' if rec.committed else ''}")
                self._step(r, x, Step.SKIPPED, f"not serving when its turn came ({why}): not taken for maintenance")
            elif x.node in unavailable:
                self._step(r, x, Step.SKIPPED, f"out in the scheduler ({sched.get(x.node)}): not taken for "
                           "maintenance")
            else:
                order.append(x.node)
        got = admit(order, unavailable, domains, r.spec, self.controller.engine.budget_violation)
        self.waiting[r.id] = dict(got.waiting)
        for node in got.start:
            x = r.node(node)
            self._step(r, x, Step.DRAINING, "started: checkpoint request, then drain")
            try:
                self.controller.maintenance_drain(node, r.id, r.actor)
            except Conflict as err:  # the budget changed since admit (another decision): wait
                self._step(r, x, Step.PENDING, f"back to pending: {err}")

    # ---- helpers ----------------------------------------------------------------------------
    def _step(self, r: Rollout, n: NodeStep, step: Step, detail: str, *, command: str | None = None) -> Step:
        now = self.controller.clock.now()
        audit = None if step == n.step else AuditEntry(now, Actor.SYSTEM, f"maintenance:{r.id}",
                                                       f"maintenance_{step.value}", n.node, f"{r.id}: {detail}")
        self.store.set_step(r.id, n.node, step, detail, now, audit, command=command)
        if step != n.step:
            level = logging.ERROR if step == Step.FAILED else logging.INFO
            log.log(level, "maintenance %s: %s %s -> %s: %s", r.id, n.node, n.step, step, detail)
        return step

    def _audit(self, rid: str, action: str, detail: str, actor: str = "") -> AuditEntry:
        who, kind = (actor, Actor.OPERATOR) if actor else (f"maintenance:{rid}", Actor.SYSTEM)
        return AuditEntry(self.controller.clock.now(), kind, who, action, rid, detail)
