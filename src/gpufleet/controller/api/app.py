"""The controller's HTTP API under ``/v1`` (OpenAPI at ``/openapi.json``, docs at ``/docs``).

Every /v1 route needs a bearer token; the role needed is in each route's description.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, FastAPI, HTTPException, Query, status

from gpufleet import __version__
from gpufleet.controller import web
from gpufleet.controller.bmc.watcher import BmcWatcher
from gpufleet.controller.bundles import Bundles
from gpufleet.controller.ha.elector import Leadership, always_leading
from gpufleet.controller.ingest import MAX_QUEUED_EVENTS, GroupCommitter
from gpufleet.controller.reconciler import Reconciler
from gpufleet.controller.retention import Retention
from gpufleet.controller.service import Controller, Heartbeat
from gpufleet.controller.settings import Role, TokenConfig
from gpufleet.controller.store.repo import ActionStatus, Page
from gpufleet.correlate.model import MAX_WATCH_DECADES, WATCH_DECADES
from gpufleet.domain.errors import Conflict, InvalidInput, NotFound
from gpufleet.domain.events import EventKind
from gpufleet.domain.fleet import Gpu, Nic, Node, gpu_slot, nic_slot
from gpufleet.domain.inventory import parse_inventory
from gpufleet.lifecycle.decisions import DecisionStatus
from gpufleet.lifecycle.engine import OperatorOp
from gpufleet.lifecycle.states import NodeState

from . import apidocs, errors, metrics
from .auth import ADMINISTER, OPERATE, READ, REPORT, Caller, TokenRegistry, require
from .bmc import bmc_router
from .commands import commands_router
from .fastpath import FastPathCounts, IngestFastPath
from .forward import ForwardTls, ForwardToLeader
from .goodput import GoodputObserver, goodput_router
from .jobevents import job_events_router, jobs_named
from .limits import DEFAULT_LIMITS, Limits, RefusedCounts, RequestLimits
from .maintenance import maintenance_router
from .schemas import (
    ApproveIn,
    AwareTime,
    BreakerResetIn,
    CheckpointIn,
    EventBatch,
    EventIn,
    HeartbeatIn,
    IngestOut,
    InventoryOut,
    Limit,
    ModeIn,
    Name,
    Offset,
    ReasonIn,
    Ref,
    RegisterIn,
)
from .scope import Scope
from .spares import spares_router
from .tenancy import tenancy_router
from .ttm import ttm_router
from .views import ActionOut, AuditOut, BreakerOut, DecisionOut, EventOut, NodeDetail, NodeOut, StatusOut, TransitionOut

Reader = Annotated[Caller, Depends(require(READ))]
Reporter = Annotated[Caller, Depends(require(REPORT))]
Operator = Annotated[Caller, Depends(require(OPERATE))]
Admin = Annotated[Caller, Depends(require(ADMINISTER))]
log = logging.getLogger(__name__)


def create_app(controller: Controller, tokens: list[TokenConfig] | tuple[TokenConfig, ...],
               reconciler: Reconciler | None = None, *, fast_ingest: bool = True,
               limits: Limits = DEFAULT_LIMITS, max_queued_events: int = MAX_QUEUED_EVENTS,
               api_docs: bool = True, openapi_requires_auth: bool = False,
               retention: Retention | None = None, bmc: BmcWatcher | None = None,
               bundles: Bundles | None = None, leadership: Leadership | None = None,
               forward_timeout_s: float = 30.0, forward_tls: ForwardTls | None = None) -> FastAPI:
    """The API app. ``fast_ingest=False`` leaves every event post to the framework's route (the fast
    path answers exactly alike; the switch exists to show that, and to rule it out when debugging).
    ``api_docs=False`` serves no ``/docs`` (Swagger UI served from the controller itself, assets
    included: apidocs.py); ``openapi_requires_auth`` serves ``/openapi.json`` only to a valid token
    (viewer or above), and no docs pages. ``leadership``: this replica's part in leader election (none: the
    only replica, always leading); a follower forwards what needs the leader (forward.py)."""
    app = FastAPI(title="gpufleet controller", version=__version__,
                  description="Reliability control plane for GPU training clusters.",
                  docs_url=None, redoc_url=None,
                  openapi_url=None if openapi_requires_auth else "/openapi.json")
    if api_docs and not openapi_requires_auth:
        apidocs.install(app, "/openapi.json", app.title)
    app.state.tokens = TokenRegistry(tokens)
    errors.install(app)
    v1 = APIRouter(prefix="/v1")
    c = controller
    store = controller.store
    tenancy = reconciler.tenancy if reconciler is not None else None
    scope = Scope(controller, tenancy.owner if tenancy is not None else None)  # tenant-scoped tokens (scope.py)

    def may_report(caller: Caller, node: str, field: str) -> None:
        _may_report(caller, node, field)
        scope.node(caller, node)  # a tenant's operator: its own nodes only (404 for the others)

    def may_checkpoint(caller: Caller, job_id: str) -> None:
        if caller.role == Role.AGENT or caller.tenant is not None:  # speaks for the jobs on its own nodes only
            _may_checkpoint(caller, job_id, reconciler, scope)
    committer = GroupCommitter(controller, max_queued_events=max_queued_events)
    app.state.ingest = committer
    # Well-formed reports skip the framework (see fastpath.py); everything else reaches the route below.
    app.state.fast_ingest = FastPathCounts()
    if fast_ingest:
        app.add_middleware(IngestFastPath, committer=committer, tokens=app.state.tokens,
                           counts=app.state.fast_ingest)
    lead = leadership if leadership is not None else always_leading()
    app.state.leadership = lead
    app.state.forwards = Counter()  # requests passed on to the leader, by outcome (a metric)
    app.state.refused = RefusedCounts()
    if lead.elected:  # inside the limits (a forwarded body is bounded), outside the fast path (leader only)
        app.add_middleware(ForwardToLeader, leadership=lead, tokens=app.state.tokens, timeout_s=forward_timeout_s,
                           tls=forward_tls or ForwardTls(), counts=app.state.forwards, refused=app.state.refused)
    # Outermost: sizes and read time are bounded before anything (the fast path, auth) reads a byte.
    app.add_middleware(RequestLimits, limits=limits, counts=app.state.refused)

    # ---- health ------------------------------------------------------------------------------
    @v1.get("/health", summary="Liveness (any valid token)")
    def health(_: Reader) -> dict[str, object]:
        return {"status": "ok", "version": __version__, "role": lead.role, "epoch": lead.epoch,
                "replica": lead.replica, "leader_url": lead.leader_url}

    @v1.get("/ready", summary="Readiness: database reachable (any valid token)")
    def ready(caller: Reader) -> dict[str, object]:
        scope.fleet(caller, "readiness")
        nodes = store.node_count()  # one cheap query: a probe runs every few seconds
        sched = reconciler.scheduler_ok if reconciler is not None else True
        return {"status": "ready", "nodes": nodes, "scheduler_reachable": sched}

    def breaker_out() -> BreakerOut:
        b = c.breaker
        return BreakerOut(tripped=b.tripped, reason=b.reason, since=b.since, held=len(c.engine.held),
                          out_in_scheduler=sorted(c.engine.external))

    @v1.get("/status", response_model=StatusOut, summary="Fleet summary (viewer)")
    def fleet_status(caller: Reader) -> StatusOut:
        scope.fleet(caller, "the fleet's status")
        counts = store.counts()
        return StatusOut(nodes=counts["nodes"], actions=counts["actions"], events=counts["events"]["total"],
                         breaker=breaker_out(),
                         dry_run=c.dry_run, scheduler_reachable=reconciler.scheduler_ok if reconciler else True,
                         ingest_queued=committer.queued,
                         refused=dict(app.state.refused) | {"overloaded": committer.refused},
                         max_clock_skew_s=c.largest_clock_skew())

    # ---- nodes -------------------------------------------------------------------------------
    @v1.get("/nodes", response_model=list[NodeOut], summary="List nodes, filtered (viewer)")
    def list_nodes(caller: Reader, state: NodeState | None = None, rack: Name | None = None, limit: Limit = 100,
                   offset: Offset = 0) -> list[NodeOut]:
        rows = store.nodes(state=state.value if state else None, rack=rack, page=Page(limit, offset),
                           within=scope.within(caller))
        return [NodeOut.model_validate(r) for r in rows]

    @v1.get("/nodes/{node}", response_model=NodeDetail, summary="A node with its history (viewer)")
    def node_detail(node: Name, caller: Reader) -> NodeDetail:
        scope.node(caller, node)
        row = store.node(node)
        if row is None:
            raise NotFound("node", node)
        return NodeDetail(
            node=NodeOut.model_validate(row),
            history=[TransitionOut.model_validate(t) for t in store.transitions(node, limit=200)],
            events=[EventOut.model_validate(e) for e in store.events(node=node, page=Page(100))],
            decisions=[DecisionOut.model_validate(d) for d in store.decisions(node=node, page=Page(100))],
            actions=[ActionOut.model_validate(a) for a in store.actions(node=node, page=Page(100))],
        )

    @v1.post("/nodes", status_code=status.HTTP_201_CREATED, summary="Register nodes (admin)")
    def register(body: RegisterIn, caller: Admin) -> dict[str, int]:
        if body.state not in (NodeState.NEW, NodeState.READY):
            raise HTTPException(422, [{"field": "state", "value": body.state, "expected": "new or ready"}])
        nodes = [Node(id=n.id, rack=n.rack, serial=n.serial,
                      gpus=tuple(Gpu(gpu_slot(n.id, g.index), g.index, g.serial, g.pci, g.sku) for g in n.gpus),
                      nics=()) for n in body.nodes]
        leaves = {n.id: frozenset(n.leaves) for n in body.nodes}
        added = c.register([_with_leaves(n, leaves[n.id]) for n in nodes], state=body.state, actor_id=caller.name)
        return {"registered": added, "already_known": len(nodes) - added}

    @v1.post("/nodes/{node}/heartbeat", summary="Agent heartbeat (agent for its nodes)")
    async def heartbeat(node: Name, body: HeartbeatIn, caller: Reporter) -> dict[str, str]:
        may_report(caller, node, "node")
        # Recorded with the other heartbeats of the writer's round (one UPDATE), answered once durable.
        await asyncio.wrap_future(committer.submit_heartbeat(Heartbeat(node, body.time, body.agent_version)))
        return {"status": "ok"}

    @v1.put("/nodes/{node}/inventory", response_model=InventoryOut,
             summary="Register the node's inventory; answers the moves and missing units it showed (agent for "
                     "its nodes)")
    def put_inventory(node: Name, body: Annotated[dict[str, Any], Body()], caller: Reporter) -> InventoryOut:
        may_report(caller, node, "node")
        if node not in c.engine.nodes:
            raise NotFound("node", node)
        inv = parse_inventory(body)
        if inv.node != node:
            raise InvalidInput("inventory.node", inv.node, f"the node of the path ({node!r})")
        implied = c.register_inventory(inv)
        return InventoryOut(moved=[EventIn.of(e) for e in implied if e.kind is EventKind.MOVED],
                            missing=[EventIn.of(e) for e in implied if e.kind is not EventKind.MOVED])

    @v1.get("/nodes/{node}/inventory", summary="The node's last registered inventory (viewer)")
    def get_inventory(node: Name, caller: Reader) -> dict[str, Any]:
        scope.node(caller, node, "inventory of node")
        inv = store.inventory(node)
        if inv is None:
            raise NotFound("inventory of node", node)
        return inv.to_json()

    def _operate(node: Name, op: OperatorOp, body: ReasonIn | None, caller: Caller) -> dict[str, object]:
        scope.node(caller, node)
        plan = c.operate(node, op, f"{caller.role}:{caller.name}", body.reason if body else "")
        return {"node": node, "state": c.state_of(node), "decision": plan.decisions[0].id if plan.decisions else None}

    @v1.post("/nodes/{node}/drain", summary="Drain now (operator; not subject to the breaker)")
    def drain(node: Name, caller: Operator, body: ReasonIn | None = None) -> dict[str, object]:
        return _operate(node, OperatorOp.DRAIN, body, caller)

    @v1.post("/nodes/{node}/resume", summary="Clear suspicion, or revalidate a drained/repaired node (operator)")
    def resume(node: Name, caller: Operator, body: ReasonIn | None = None) -> dict[str, object]:
        return _operate(node, OperatorOp.RESUME, body, caller)

    @v1.post("/nodes/{node}/repair-complete", summary="Repair finished: revalidate (operator)")
    def repair_complete(node: Name, caller: Operator, body: ReasonIn | None = None) -> dict[str, object]:
        return _operate(node, OperatorOp.REPAIR_DONE, body, caller)

    @v1.post("/nodes/{node}/retire", summary="Retire the node (operator)")
    def retire(node: Name, caller: Operator, body: ReasonIn | None = None) -> dict[str, object]:
        return _operate(node, OperatorOp.RETIRE, body, caller)

    @v1.post("/nodes/{node}/burn-in", summary="Start burn-in of a new node (operator)")
    def burn_in(node: Name, caller: Operator, body: ReasonIn | None = None) -> dict[str, object]:
        return _operate(node, OperatorOp.BURN_IN, body, caller)

    # ---- events ------------------------------------------------------------------------------
    @v1.post("/events", status_code=status.HTTP_202_ACCEPTED, response_model=IngestOut,
             summary="Ingest a batch of events, all or nothing (agent for its nodes)")
    async def ingest(body: EventBatch, caller: Reporter) -> IngestOut:
        for i, e in enumerate(body.events):
            may_report(caller, e.node, f"events[{i}].node")
        # Group commit: concurrent reports share one transaction; this answers once ours is durable.
        r = await asyncio.wrap_future(committer.submit([e.to_domain() for e in body.events]))
        return IngestOut(accepted=r.accepted, duplicates=r.duplicates, decisions=r.decisions)

    @v1.get("/events", response_model=list[EventOut], summary="List events, newest first (viewer)")
    def list_events(caller: Reader, node: Name | None = None, kind: EventKind | None = None,
                    since: AwareTime | None = None, limit: Limit = 100, offset: Offset = 0) -> list[EventOut]:
        rows = store.events(node=node, kind=kind.value if kind else None, since=since, page=Page(limit, offset),
                            within=scope.within(caller))
        return [EventOut.model_validate(e) for e in rows]

    # ---- decisions, actions, audit -----------------------------------------------------------
    @v1.get("/decisions", response_model=list[DecisionOut], summary="Decisions, newest first (viewer)")
    def list_decisions(caller: Reader, node: Name | None = None, status: DecisionStatus | None = None,
                       limit: Limit = 100, offset: Offset = 0) -> list[DecisionOut]:
        return [DecisionOut.model_validate(d) for d in store.decisions(node=node,
                                                                       status=status.value if status else None,
                                                                       page=Page(limit, offset),
                                                                       within=scope.within(caller))]

    @v1.post("/nodes/{node}/cancel-held", summary="Cancel the decision the breaker holds for a node (operator)")
    def cancel_held(node: Name, caller: Operator, body: ReasonIn | None = None) -> dict[str, object]:
        scope.node(caller, node)
        plan = c.cancel_held(node, f"{caller.role}:{caller.name}", body.reason if body else "")
        return {"node": node, "state": c.state_of(node), "cancelled": [d for d, _ in plan.status_changes]}

    @v1.post("/held/approve", summary="Carry out held decisions over the budget (operator)")
    def approve_held(body: ApproveIn, caller: Operator) -> dict[str, object]:
        nodes = list(body.nodes) or c.engine.held_group(f"correlate:{body.component}")
        if not all(scope.sees(caller, n) for n in nodes):  # a tenant approves its own nodes only
            if body.nodes:
                scope.node(caller, next(n for n in nodes if not scope.sees(caller, n)))
            raise NotFound("held decisions for", body.component)
        if not nodes:
            raise NotFound("held decisions for", body.component or "the given nodes")
        c.approve_held(nodes, f"{caller.role}:{caller.name}")
        return {"approved": nodes, "states": {n: c.state_of(n) for n in nodes}}

    @v1.get("/verdicts", summary="Current correlation suspects, most likely first, and the watch list (viewer)")
    def verdicts(caller: Reader, watch: Annotated[float, Query(ge=0, le=MAX_WATCH_DECADES)] = WATCH_DECADES
                 ) -> dict[str, object]:
        ranked = sorted(c.verdicts, key=lambda s: -s.confidence)
        if caller.tenant is None:
            return {"suspects": [{**s.to_dict(), "affected_nodes": list(s.affected_nodes), "reason": s.reason,
                                  "finding": s.finding.value, "repeats": s.repeats} for s in ranked],
                    "watching": [w.to_dict() for w in c.watching(watch)] if watch else []}
        # a tenant: the suspects behind its own nodes, with its own nodes only (the reason names others)
        mine = [(s, [n for n in s.affected_nodes if scope.sees(caller, n)]) for s in ranked]
        return {"suspects": [{"component": s.component, "kind": s.kind, "confidence": s.confidence,
                              "affected_nodes": nodes, "reason": ""} for s, nodes in mine if nodes],
                "watching": []}  # below significance, a pattern names no tenant's node: not shown to tenants

    @v1.get("/actions", response_model=list[ActionOut], summary="Outbox actions; status=pending|waiting|failed|done")
    def list_actions(caller: Reader, node: Name | None = None, status: Name | None = None, limit: Limit = 100,
                     offset: Offset = 0) -> list[ActionOut]:
        if status is not None and status not in ActionStatus.ALL:  # a typo is not "none failed"
            raise InvalidInput("status", status, f"one of {', '.join(ActionStatus.ALL)}")
        return [ActionOut.model_validate(a) for a in store.actions(node=node, status=status,
                                                                   page=Page(limit, offset),
                                                                   within=scope.within(caller))]

    @v1.post("/actions/{action_id}/retry", response_model=ActionOut, summary="Retry a failed action (operator)")
    def retry_action(action_id: Ref, caller: Operator) -> ActionOut:
        row = store.action(action_id)
        if row is None or not scope.sees(caller, row.node):
            raise NotFound("action", action_id)
        if row.status != ActionStatus.FAILED:
            raise Conflict(f"action {action_id} is {row.status}; only failed actions can be retried")
        store.retry_action(action_id, c.clock.now(), f"{caller.role}:{caller.name}")
        again = store.action(action_id)
        assert again is not None
        return ActionOut.model_validate(again)

    @v1.get("/audit", response_model=list[AuditOut], summary="Audit log, newest first (viewer)")
    def audit(caller: Reader, target: Ref | None = None, limit: Limit = 100, offset: Offset = 0) -> list[AuditOut]:
        return [AuditOut.model_validate(a) for a in store.audit(target=target, page=Page(limit, offset),
                                                                within=scope.within(caller))]

    # ---- breaker, mode, checkpoints ----------------------------------------------------------
    @v1.get("/breaker", response_model=BreakerOut, summary="Blast-radius breaker (viewer)")
    def breaker(caller: Reader) -> BreakerOut:
        scope.fleet(caller, "the breaker")
        return breaker_out()

    @v1.post("/breaker/reset", response_model=BreakerOut, summary="Reset the breaker (operator)")
    def reset_breaker(caller: Operator, body: BreakerResetIn | None = None) -> BreakerOut:
        scope.fleet(caller, "the breaker")
        c.reset_breaker(f"{caller.role}:{caller.name}", discard_held=bool(body and body.discard_held))
        return breaker_out()

    @v1.get("/mode", summary="Dry-run switch (viewer)")
    def get_mode(_: Reader) -> dict[str, bool]:
        return {"dry_run": c.dry_run}

    @v1.put("/mode", summary="Toggle dry-run (operator)")
    def set_mode(body: ModeIn, caller: Operator) -> dict[str, bool]:
        scope.fleet(caller, "the dry-run switch")
        c.set_dry_run(body.dry_run, f"{caller.role}:{caller.name}")
        return {"dry_run": c.dry_run}

    @v1.post("/jobs/{job_id}/checkpoint", status_code=status.HTTP_202_ACCEPTED,
             summary="A job reports a completed checkpoint (agent/operator)")
    def checkpoint(job_id: Name, body: CheckpointIn, caller: Reporter) -> dict[str, str]:
        may_checkpoint(caller, job_id)
        c.checkpoint(job_id, body.time)
        return {"status": "recorded"}

    goodput_observers: list[GoodputObserver] = []  # the metrics join below
    v1.include_router(goodput_router(controller, may_checkpoint, scope, goodput_observers))
    v1.include_router(job_events_router(controller, reconciler, scope))  # GET /v1/jobs/{id}/events: for trackers
    v1.include_router(commands_router(controller, may_report))  # the agent command channel (repairs)
    v1.include_router(ttm_router(controller, scope))  # GET /v1/ttm: time to market
    if reconciler is not None and reconciler.maintenance is not None:  # maintenance rollouts
        v1.include_router(maintenance_router(reconciler.maintenance, scope))
    if reconciler is not None:  # hot-spare pools ([] without [spares] pools)
        v1.include_router(spares_router(reconciler.spares, scope))
    v1.include_router(bmc_router(controller, may_report, bmc, bundles, scope))  # firmware, diagnostic bundles
    v1.include_router(tenancy_router(tenancy, scope))  # tenancy moves, tenants (docs/tenancy.md)
    app.include_router(v1)
    installed = metrics.install(app, controller, committer, reconciler, retention, scope=scope,  # GET /metrics
                                leadership=lead)
    goodput_observers.append(installed.on_goodput)
    web.install(app, controller, reconciler)  # GET / and /ui/...: the web UI (controller/web)
    _declare_bearer(app)
    if openapi_requires_auth:
        @app.get("/openapi.json", include_in_schema=False)
        def openapi_doc(_: Reader) -> dict[str, Any]:
            return app.openapi()

    return app


def _declare_bearer(app: FastAPI) -> None:
    """Tell OpenAPI clients (and /docs) that every /v1 route takes ``Authorization: Bearer <token>``."""
    from fastapi.openapi.utils import get_openapi

    def schema() -> dict[str, object]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            doc.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer", "description": "a token from controller.toml"}}
            # Every 422 is {"detail": [{"field", "value", "expected"}]} (errors.py), not FastAPI's default.
            doc["components"].setdefault("schemas", {})["ValidationError"] = {
                "title": "ValidationError", "type": "object", "required": ["field", "value", "expected"],
                "properties": {"field": {"type": "string", "description": "e.g. events[3].time"},
                               "value": {"description": "the value sent (cut to 200 characters)"},
                               "expected": {"type": "string"}}}
            for path, ops in doc.get("paths", {}).items():
                if path.startswith("/v1/"):
                    for op in ops.values():
                        op["security"] = [{"bearer": []}]
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = schema  # type: ignore[method-assign]


def _may_report(caller: Caller, node: str, field: str) -> None:
    if not caller.may_report_for(node):
        log.warning("refused a report of token %r for node %r (%s): not one of its nodes", caller.name, node[:200],
                    field)
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"{field}: token {caller.name!r} may not report for {node!r}")


def _may_checkpoint(caller: Caller, job_id: str, reconciler: Reconciler | None, scope: Scope) -> None:
    """403 unless the scheduler runs ``job_id`` on a node the agent token may report for; for a
    tenant-scoped token, 404 unless it runs on one of the tenant's nodes (as if there were no such job)."""
    if reconciler is None:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"job_id: cannot tell which nodes run {job_id!r} "
                            "(no scheduler): only an operator may report its checkpoint")
    jobs = jobs_named(reconciler, job_id)
    nodes = sorted({n for j in jobs for n in j.nodes})
    if not jobs or (caller.tenant is not None and not any(scope.sees(caller, n) for n in nodes)):
        raise NotFound("job", job_id)
    if caller.role != Role.AGENT:
        return
    if not any(caller.may_report_for(n) for n in nodes):
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"job_id: token {caller.name!r} may not report for job "
                            f"{job_id!r}: it runs on {', '.join(nodes[:5]) or 'no node'}, none of them its nodes")


def _with_leaves(node: Node, leaves: frozenset[str]) -> Node:
    nics = tuple(Nic(nic_slot(node.id, i), i, "", leaf) for i, leaf in enumerate(sorted(leaves)))
    return Node(node.id, node.rack, node.serial, node.gpus, nics)
