"""Tenancy inside the controller (docs/tenancy.md): who owns each node, and moving a node to another
tenant through a reprovision that cannot be skipped.

**Ownership** (:meth:`Tenancy.owner`): the owner the store recorded at the node's last move, else the
``[[tenant]]`` pool the node matches (``domain.tenancy.owner``). The API scopes tenant tokens with it.

**A move** (:meth:`Tenancy.move`) is the only way a node changes tenant. In one transaction the move is
recorded and the node released (no tenant: nobody scoped sees it); then a one-node maintenance rollout
(controller.maintenance, the machinery that exists) carries the node through

* **drain**: its job is asked to checkpoint, then the node is drained through the scheduler;
* **wipe**: ``[tenancy] wipe = "script:NAME"`` queued on the agent command channel under its key —
  queued once, run at most once by the agent (its journal), however often the controller restarts;
* **validation**: ``[tenancy] validate`` (full by default) through a validation job;

and :meth:`on_pass` hands the node over — the new owner written in the same transaction that completes
the move, with its audit line — only once the rollout reports the node ``done``. A failed, skipped or
timed-out step completes the move as failed: the node keeps no tenant and stays out (in repair) until
people look at it and move it again. The runner keeps no state but a cache of the store's owners, so a
restarted controller resumes every running move from the store.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence

from gpufleet.controller.maintenance import Maintenance
from gpufleet.controller.settings import TenancySettings
from gpufleet.controller.store.maintenance import Rollout
from gpufleet.controller.store.tenancy import Move, TenancyStore, being_moved
from gpufleet.domain.errors import Conflict, InvalidInput, NotFound
from gpufleet.domain.tenancy import Tenant, check_pools, owner
from gpufleet.lifecycle.maintenance import OnFailure, RolloutState, Selector, Spec, Step
from gpufleet.lifecycle.plan import AuditEntry
from gpufleet.lifecycle.states import SCHEDULABLE, Actor

log = logging.getLogger(__name__)
_WIDE = 1_000_000  # a move's rollout is one node: the fleet-wide budget is the breaker's, not the rollout's


class Tenancy:
    def __init__(self, maintenance: Maintenance, tenants: Sequence[Tenant],
                 settings: TenancySettings | None = None) -> None:
        self.maintenance = maintenance
        self.controller = maintenance.controller
        self.tenants = tuple(tenants)
        self.names = {t.name for t in self.tenants}
        self.settings = settings or TenancySettings()
        self.store = TenancyStore(self.controller.store)
        self._lock = threading.Lock()
        self._owners = self.store.owners()  # the store's record; replaced whole, never mutated in place

    # ---- ownership --------------------------------------------------------------------------
    def owner(self, node: str) -> str | None:
        return owner(node, self.tenants, self._owners)

    def nodes_of(self, tenant: str) -> frozenset[str]:
        """The registered nodes ``tenant`` owns now."""
        with self.controller.lock:
            nodes = list(self.controller.engine.nodes)
        return frozenset(n for n in nodes if self.owner(n) == tenant)

    def check(self) -> None:
        """At start: every configured pattern matches a registered node, no node is in two pools."""
        with self.controller.lock:
            nodes = list(self.controller.engine.nodes)
        check_pools(self.tenants, nodes)

    # ---- moves ------------------------------------------------------------------------------
    def move(self, node: str, to: str, actor: str, reason: str = "") -> Move:
        if to not in self.names:
            raise InvalidInput("to", to, f"a tenant of [[tenant]] ({', '.join(sorted(self.names)) or 'none'})")
        if not self.settings.wipe:
            raise Conflict('moves need [tenancy] wipe = "script:NAME" (the agents\' reimage script) or "pxe" '
                           "(through the BMC): a node is never handed to another tenant without a wipe")
        state = self.controller.state_of(node)  # NotFound for an unknown node
        was = self.owner(node)
        if was == to:
            raise Conflict(f"node {node} belongs to tenant {to!r} already")
        running = self.store.moves(running_only=True, nodes=[node], limit=1)
        if running:  # draining or being wiped for it: not "resume or repair it first"
            raise being_moved(node, running[0].id)
        if state not in SCHEDULABLE:
            raise Conflict(f"node {node} is {state}: only a serving node is moved (resume or repair it first)")
        now = self.controller.clock.now()
        mid, rid = f"t-{uuid.uuid4().hex[:10]}", f"m-{uuid.uuid4().hex[:10]}"
        s = self.settings
        detail = (f"{mid}: {was or 'no tenant'} -> {to}: drain, {s.wipe}, {s.validation} validation, then "
                  f"handover (rollout {rid})" + (f"; {reason}" if reason else ""))
        with self._lock:  # with the rollout's creation: a pass in between would create it too
            m = self.store.begin(Move(mid, node, was, to, rid, "running", "draining", actor, now, now),
                                 AuditEntry(now, Actor.OPERATOR, actor, "tenancy_move", node, detail))
            self._owners = self.store.owners()
            log.warning("tenancy: %s by %s", detail, actor)
            self._rollout(m)
        return self.store.get(mid)

    def on_pass(self) -> None:
        """After the maintenance runner's pass: hand over the nodes whose reprovision finished."""
        with self._lock:
            running = self.store.moves(running_only=True, limit=10_000)
            if not running:
                return
            for m in running:
                try:
                    self._advance(m)
                except Exception:  # never let one move stop the others or the reconciler's pass
                    log.exception("tenancy move %s of %s: pass failed; trying again on the next pass", m.id, m.node)
            self._owners = self.store.owners()

    def _advance(self, m: Move) -> None:
        r = self._rollout(m)
        n = r.node(m.node)
        now = self.controller.clock.now()
        if n.step == Step.DONE:
            detail = f"{m.id}: reprovisioned ({self.settings.wipe}, validated): handed over to {m.to_tenant}"
            if self.store.finish(m.id, True, detail, now, self._audit("tenancy_handover", m.node, detail)):
                log.warning("tenancy: %s", detail)
        elif n.step in (Step.FAILED, Step.SKIPPED) or r.state in (RolloutState.ABORTED, RolloutState.DONE):
            detail = (f"{m.id}: reprovision {n.step}: {n.detail}; the node has no tenant and stays out until "
                      "people look at it (move it again once it is back)")
            if self.store.finish(m.id, False, detail, now, self._audit("tenancy_move_failed", m.node, detail)):
                log.error("tenancy: %s", detail)
        elif n.detail and n.detail != m.detail:
            self.store.note(m.id, f"{n.step}: {n.detail}", now)

    def _rollout(self, m: Move) -> Rollout:
        """The move's rollout, created and started if a crash came between the move and either."""
        ms = self.maintenance.store
        try:
            r = ms.get(m.rollout)
        except NotFound:
            s = self.settings
            spec = Spec(Selector(f"nodes:{m.node}"), s.wipe, _WIDE, _WIDE, OnFailure.STOP, s.validation,
                        s.drain_timeout, s.wipe_timeout, s.validate_timeout)
            r = ms.create(m.rollout, spec, [m.node], m.actor, self.controller.clock.now(),
                          self._audit("maintenance_plan", m.rollout, f"reprovision of {m.node} for move {m.id}",
                                      m.actor))
        if r.state == RolloutState.PLANNED:
            r = self.maintenance.start(r.id, m.actor)
        return r

    def _audit(self, action: str, target: str, detail: str, actor: str = "") -> AuditEntry:
        who, kind = (actor, Actor.OPERATOR) if actor else ("tenancy", Actor.SYSTEM)
        return AuditEntry(self.controller.clock.now(), kind, who, action, target, detail)
