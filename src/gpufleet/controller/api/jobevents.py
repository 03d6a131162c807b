"""What happened to a job's nodes while it ran: ``GET /v1/jobs/{job}/events`` (viewer; docs/api.md).

The experiment-tracker export (:mod:`gpufleet.goodput.trackers`) asks for it to put infrastructure
events next to the training curves. One list, oldest first, merged from three tables for the job's
nodes over ``[since, until)``:

* ``event``: health events the agents, checks and the training side reported (XID, AER, ECC, links,
  thermal, GPU lost, a failed check such as a straggler finding, ...), each with its severity;
* ``transition``: the node's lifecycle steps (``ready -> draining`` is a drain, with its reason);
* ``action``: what the controller did about it (``drain``, ``drain_after_checkpoint`` — the job was
  asked for a checkpoint —, ``requeue_jobs``, ``repair``), at the time it was queued.

The job's nodes are the ``node`` query parameters when given (the training side knows its hosts: the
run log records each rank's), else the nodes the scheduler runs the job on now; neither is a 404.
The controller keeps no history of which job ran where, so a finished job's nodes must be named.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel

from gpufleet.controller.reconciler import Reconciler
from gpufleet.controller.service import Controller
from gpufleet.controller.store.jobevents import newest_on
from gpufleet.domain.errors import ExternalError, GpufleetError, InvalidInput, NotFound
from gpufleet.schedulers.port import Job

from .auth import READ, Caller, require
from .schemas import AwareTime, Name
from .scope import Scope

Reader = Annotated[Caller, Depends(require(READ))]
MAX_NODES = 256  # a job's nodes named in one request
DEFAULT_RANGE = timedelta(days=7)
MAX_RANGE = timedelta(days=366)


class JobEventOut(BaseModel):
    time: datetime
    node: str
    source: str  # event | transition | action
    kind: str  # the event kind (xid, aer_uncorrected, check_failed, ...), "draining" (the state entered), "drain"
    severity: str | None  # fatal | degraded | info for events; None for the others
    component: str | None
    code: int | None
    message: str  # the event's message, the transition's or action's reason
    attrs: dict[str, Any]  # the event's attrs; from/to state and actor for a transition; status for an action


class JobEventsOut(BaseModel):
    job: str
    nodes: list[str]
    since: datetime
    until: datetime
    events: list[JobEventOut]
    truncated: bool  # more than ``limit`` matched: the newest ``limit`` are listed (ask again with until=)


def jobs_named(reconciler: Reconciler, job_id: str) -> list[Job]:
    """The scheduler's job with id ``job_id`` now (none when it does not know it); ExternalError when the
    scheduler cannot be read. One job is read, never the whole queue (a checkpoint report comes here)."""
    try:
        return [reconciler.scheduler.job(job_id)]
    except NotFound:
        return []
    except GpufleetError:
        raise
    except Exception as err:
        raise ExternalError("scheduler", f"listing jobs: {type(err).__name__}") from err


def job_events_router(controller: Controller, reconciler: Reconciler | None, scope: Scope) -> APIRouter:
    r = APIRouter()
    store = controller.store

    def job_nodes(job_id: str) -> list[str]:
        if reconciler is None:
            raise NotFound("nodes of job", f"{job_id} (no scheduler: name them with ?node=)")
        nodes = sorted({n for j in jobs_named(reconciler, job_id) for n in j.nodes})
        if not nodes:
            raise NotFound("nodes of job", f"{job_id} (the scheduler does not run it now: name them with ?node=)")
        return nodes

    @r.get("/jobs/{job_id}/events", response_model=JobEventsOut,
           summary="Infrastructure events on a job's nodes: health events, drains, checkpoint requests (viewer)")
    def job_events(job_id: Name, caller: Reader, node: Annotated[list[Name] | None, Query()] = None,
                   since: AwareTime | None = None, until: AwareTime | None = None,
                   limit: Annotated[int, Query(ge=1, le=1000)] = 500) -> JobEventsOut:
        if node is not None and len(node) > MAX_NODES:
            raise InvalidInput("node", f"{len(node)} nodes", f"at most {MAX_NODES} nodes per request")
        hi = until or controller.clock.now()
        lo = since or hi - DEFAULT_RANGE
        if hi <= lo:
            raise InvalidInput("until", hi.isoformat(), f"a time after since ({lo.isoformat()})")
        if hi - lo > MAX_RANGE:
            raise InvalidInput("since", lo.isoformat(), f"a range of at most {MAX_RANGE.days} days before until")
        if node:
            for n in node:  # a tenant names its own nodes only (404 as for a node that does not exist)
                scope.node(caller, n)
            nodes = sorted(set(node))
        else:
            nodes = [n for n in job_nodes(job_id) if scope.sees(caller, n)]
            if not nodes:
                raise NotFound("nodes of job", job_id)
        # each source's newest limit + 1 per node in the range (one more tells whether it was cut), less
        # those with limit + 1 newer ones: three statements whatever the number of nodes
        events, transitions, actions = newest_on(store, nodes, lo, hi, limit + 1)
        out: list[JobEventOut] = []
        for e in events:
            out.append(JobEventOut(time=e.time, node=e.node, source="event", kind=e.kind, severity=e.severity,
                                   component=e.component, code=e.code, message=e.message,
                                   attrs={**e.attrs, "event_id": e.id, "reported_by": e.source}))
        for t in transitions:
            out.append(JobEventOut(time=t.time, node=t.node, source="transition", kind=t.to_state, severity=None,
                                   component=None, code=None, message=t.reason,
                                   attrs={"from_state": t.from_state, "to_state": t.to_state,
                                          "actor": f"{t.actor}:{t.actor_id}"}))
        for a in actions:
            out.append(JobEventOut(time=a.created, node=a.node, source="action", kind=a.kind, severity=None,
                                   component=None, code=None, message=a.reason,
                                   attrs={"status": a.status, "action_id": a.id}))
        # (time, node, source, kind) ties keep their source's order: the sort is stable
        out.sort(key=lambda e: (e.time, e.node, e.source, e.kind), reverse=True)
        return JobEventsOut(job=job_id, nodes=nodes, since=lo, until=hi, events=out[:limit][::-1],
                            truncated=len(out) > limit)

    return r
