"""Goodput a training job reports, and the roll-up over a time range (docs/api.md, docs/goodput.md).

* ``POST /v1/jobs/{job}/goodput`` ``{"run", "world", "intervals": [...]}`` — final intervals of a run
  (:mod:`gpufleet.goodput.intervals`). Who may post: the roles that may report a job's checkpoint (an
  operator or admin token; an agent token only for a job the scheduler runs on one of its nodes).
  Idempotent: ``(job, run, start)`` is the key, the same interval again counts as a duplicate, other
  values under a stored key are a 409 and the batch is refused whole.
* ``GET /v1/jobs/{job}/goodput`` — the job's intervals (oldest first, paged) and its totals (viewer).
* ``GET /v1/goodput?since=&until=&limit=`` — ETTR, badput by category and MFU per job and for the
  cluster over ``[since, until)`` (default: the last 24 hours) (viewer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Query, status
from pydantic import BaseModel

from gpufleet.controller.service import Controller
from gpufleet.controller.store.goodput import GoodputStore
from gpufleet.controller.store.repo import Page
from gpufleet.domain.errors import InvalidInput, NotFound
from gpufleet.goodput.ettr import Badput
from gpufleet.goodput.rollup import Goodput, JobInterval, rollup

from .auth import READ, REPORT, Caller, require
from .schemas import AwareTime, GoodputIn, Name
from .scope import Scope

Reader = Annotated[Caller, Depends(require(READ))]
Reporter = Annotated[Caller, Depends(require(REPORT))]
DEFAULT_RANGE = timedelta(hours=24)
MAX_RANGE = timedelta(days=366)


class GoodputPostOut(BaseModel):
    accepted: int
    duplicates: int


class IntervalOut(BaseModel):
    run: str
    start: datetime
    end: datetime
    productive_s: float
    badput_s: dict[str, float]
    steps: int
    step_s: float
    flops: float | None
    peak_flops: float | None
    world: int
    mfu: float | None


class GoodputOut(BaseModel):
    elapsed_s: float
    productive_s: float
    ettr: float | None
    badput_s: dict[str, float]
    steps: float
    mfu: float | None


class JobGoodputOut(BaseModel):
    job: str
    total: GoodputOut | None
    intervals: list[IntervalOut]


class JobRollupOut(GoodputOut):
    job: str


class RollupOut(BaseModel):
    since: datetime
    until: datetime
    cluster: GoodputOut
    jobs: list[JobRollupOut]
    jobs_total: int
    truncated: bool


def interval_out(i: JobInterval) -> IntervalOut:
    mfu = i.flops / (i.step_s * i.peak_flops) if i.flops is not None and i.peak_flops and i.step_s > 0 else None
    return IntervalOut(run=i.run, start=i.start, end=i.end, productive_s=i.productive, badput_s=i.badput.as_dict(),
                       steps=i.steps, step_s=i.step_s, flops=i.flops, peak_flops=i.peak_flops, world=i.world, mfu=mfu)


def goodput_out(g: Goodput) -> GoodputOut:
    return GoodputOut(elapsed_s=g.elapsed, productive_s=g.productive, ettr=g.ettr, badput_s=g.badput, steps=g.steps,
                      mfu=g.mfu)


GoodputObserver = Callable[[str, Sequence[JobInterval], Goodput | None], None]


def goodput_router(controller: Controller, may_post: Callable[[Caller, str], None], scope: Scope,
                   observers: Sequence[GoodputObserver] = ()) -> APIRouter:
    """The routes; each ``observers`` entry is told (job, intervals newly stored, the job's totals)."""
    r = APIRouter()
    c = controller
    store = GoodputStore(controller.store)

    @r.post("/jobs/{job_id}/goodput", status_code=status.HTTP_202_ACCEPTED, response_model=GoodputPostOut,
            summary="A training job reports final goodput intervals (agent for the job's nodes / operator)")
    def post_goodput(job_id: Name, body: GoodputIn, caller: Reporter) -> GoodputPostOut:
        may_post(caller, job_id)
        now = c.clock.now()
        for n, i in enumerate(body.intervals):
            if i.end > now + c.max_clock_skew:
                raise InvalidInput(f"intervals[{n}].end", i.end.isoformat(), f"a time no later than the "
                                   f"controller's clock ({now.isoformat()}) plus {c.max_clock_skew}")
        rows = [JobInterval(job_id, body.run, i.start, i.end, i.productive_s, Badput(**i.badput_s.model_dump()),
                            i.steps, i.step_s, i.flops, i.peak_flops, body.world) for i in body.intervals]
        accepted, duplicates, new = store.add(rows, now)
        if observers and new:
            span = store.span(job_id)
            total = None
            if span is not None:
                total = rollup(store.in_range(*span, jobs=[job_id])[0], *span).jobs.get(job_id)
            for cb in observers:
                cb(job_id, new, total)
        return GoodputPostOut(accepted=accepted, duplicates=duplicates)

    @r.get("/jobs/{job_id}/goodput", response_model=JobGoodputOut,
           summary="A job's goodput intervals, oldest first, and its totals (viewer)")
    def job_goodput(job_id: Name, caller: Reader, limit: Annotated[int, Query(ge=1, le=1000)] = 1000,
                    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0) -> JobGoodputOut:
        if caller.tenant is not None:  # a tenant: the jobs the scheduler runs on its nodes now (404 otherwise)
            may_post(caller, job_id)
        span = store.span(job_id)
        if span is None:
            raise NotFound("goodput of job", job_id)
        page = store.of_job(job_id, Page(limit, offset))
        rows, _more = store.in_range(*span, jobs=[job_id])
        total = rollup(rows, *span).jobs.get(job_id)
        return JobGoodputOut(job=job_id, total=None if total is None else goodput_out(total),
                             intervals=[interval_out(i) for i in page])

    @r.get("/goodput", response_model=RollupOut,
           summary="ETTR, badput and MFU per job and for the cluster over a time range (viewer)")
    def cluster_goodput(caller: Reader, since: AwareTime | None = None, until: AwareTime | None = None,
                        limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> RollupOut:
        scope.fleet(caller, "the cluster's goodput")
        hi = until or c.clock.now()
        lo = since or hi - DEFAULT_RANGE
        if hi <= lo:
            raise InvalidInput("until", hi.isoformat(), f"a time after since ({lo.isoformat()})")
        if hi - lo > MAX_RANGE:
            raise InvalidInput("since", lo.isoformat(), f"a range of at most {MAX_RANGE.days} days before until")
        rows, truncated = store.in_range(lo, hi)
        roll = rollup(rows, lo, hi)
        ranked = sorted(roll.jobs.items(), key=lambda kv: (-kv[1].elapsed, kv[0]))[:limit]
        return RollupOut(since=lo, until=hi, cluster=goodput_out(roll.cluster), truncated=truncated,
                         jobs_total=len(roll.jobs),
                         jobs=[JobRollupOut(job=j, **goodput_out(g).model_dump()) for j, g in ranked])

    return r
