"""The reconciler: carries out outbox actions through the scheduler, idempotently, with retries.

Loop (``run_once``): read the scheduler's view (ready <-> in_service, draining -> drained), run the
engine's time-driven rules, then execute every due action. The action id is the dedup key: a ``done``
action is never executed again, and every scheduler call is itself idempotent, so re-running an
action after a crash (executed, not yet recorded) changes nothing. A failure is recorded and retried
with capped exponential backoff; permanent failures (a foreign drain, an unknown node) and actions
that exhaust their attempts are marked ``failed`` and logged at ERROR with the manual step to take.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Protocol

from gpufleet.domain.errors import Conflict, ExternalError, InvalidInput, NotFound
from gpufleet.domain.events import EventKind, HealthEvent, Severity
from gpufleet.lifecycle.checkpoint import CheckpointWait, job_gpus
from gpufleet.lifecycle.decisions import ActionKind
from gpufleet.lifecycle.engine import SchedObservation
from gpufleet.lifecycle.plan import AuditEntry, OutboxAction, Plan
from gpufleet.lifecycle.states import Actor, NodeState
from gpufleet.lifecycle.validation import plan_validation
from gpufleet.schedulers.port import (
    BEFORE,
    Job,
    RunStatus,
    SchedNode,
    SchedNodeState,
    Scheduler,
    drain_reason,
)

from .failurelog import FailureLog
from .faults import NEVER_STARTED, fault_of
from .fleetjudge import FleetJudge
from .maintenance import Maintenance
from .placement import place_suspects_last
from .repairer import Repairer
from .service import Controller
from .spares import Spares
from .store.repo import ActionStatus
from .tenancy import Tenancy

log = logging.getLogger(__name__)
FULL_SYNC_EVERY = 30  # passes between full scheduler syncs (incremental in between)
# States in which gpufleet has confirmed the node drained and keeps it out until it is revalidated.
HELD_OUT = frozenset({NodeState.DRAINED, NodeState.REPAIR, NodeState.REVALIDATE})
VALIDATING = frozenset({NodeState.REVALIDATE, NodeState.BURN_IN})
_BUSY = frozenset({SchedNodeState.ALLOCATED, SchedNodeState.DRAINING})  # the port: running at least one job


DRIFT = "drift"  # the decision id of a drift re-drain's reason (gpufleet:drift ...)


def drift_reason(state: NodeState, before: str) -> str:
    """The reason of a drift re-drain: gpufleet's (so revalidation resumes the node as its own drain), and
    then the reason the node had while it was last out (``before``: an operator's words, or gpufleet's
    earlier reason), which the resume erased in the scheduler (Slurm clears it) and the re-drain would
    otherwise replace. A node re-drained again keeps the first reason, not a chain (decision 0128)."""
    if before.startswith(drain_reason(DRIFT, "")):
        before = before.partition(BEFORE)[2]
    text = f"{state}: not revalidated"
    return drain_reason(DRIFT, f"{text}{BEFORE}{before}" if before else text)


def _busy(name: str, n: SchedNode | None) -> str:
    """A partner that is not free, said with what the scheduler shows of it."""
    if n is None:
        return f"{name} (not in the scheduler)"
    return f"{name} ({n.state}{', job ' + ','.join(n.jobs) if n.jobs else ''})"


def _out_in_scheduler(n: SchedNode) -> str:
    """Why the scheduler has ``n`` out of service (drained or down, by anyone: an operator, the health-check
    hook, gpufleet itself), or "" while it can run jobs."""
    if n.state in (SchedNodeState.DRAINING, SchedNodeState.DRAINED, SchedNodeState.DOWN):
        return f"{n.state.value}: {n.reason or 'no reason given'}"
    return ""


class Validator(Protocol):
    """Runs active validation of a node (burn-in, revalidation). Results come back as check events
    (``gpufleet check --controller ...``); the reconciler follows the run it started.

    * ``request`` starts a run for the outbox action ``key`` and returns a handle to follow (a Slurm
      job id), or ``""`` when there is nothing to follow (the results simply arrive). Idempotent on
      ``key``: asked again after a crash, it returns the run already started. With ``partners`` (a
      ``multinode`` level) the run spans the node and those known-good nodes.
    * ``partners`` is how many known-good nodes a fabric fault's validation pairs the node with
      (0: this validator cannot pair; fabric faults get their single-node level).
    * ``status`` says where a run stands (``RunStatus``): how it ended (one line), else why it has not
      started yet (the scheduler's pending reason), else running. A run pending longer than the policy's
      ``validation_start_timeout`` after it was submitted is ended with ``cancel`` (idempotent: a run
      that is gone already is fine) and the validation fails, naming the pending reason.
    * ``release`` ends any hold the validator put on the node (a maintenance reservation); a no-op
      when there is none. ``holds`` says whether there is one (such a node may look schedulable).
    * Failures: ExternalError (retried), Conflict (a node drained by someone else: not touched).
    """

    @property
    def partners(self) -> int: ...

    def request(self, node: str, level: str, key: str, partners: Sequence[str] = ()) -> str: ...

    def status(self, handle: str) -> RunStatus: ...

    def cancel(self, handle: str) -> None: ...

    def release(self, node: str) -> None: ...

    def holds(self, node: str) -> bool: ...


class Reconciler:
    def __init__(self, controller: Controller, scheduler: Scheduler, validator: Validator | None = None,
                 *, fleet_judge: FleetJudge | None = None, sync_interval: float = 0.0,
                 repairer: Repairer | None = None, maintenance: Maintenance | None = None,
                 tenancy: Tenancy | None = None, spares: Spares | None = None) -> None:
        if sync_interval < 0:
            raise InvalidInput("scheduler_sync_interval", sync_interval, "seconds, 0 or more (0 = every pass)")
        self.controller = controller
        self.scheduler = scheduler
        self.validator = validator
        self.repairer = repairer  # repair executors and the escalation ladder (None: repair is people's)
        self.fleet_judge = fleet_judge  # runs at its own low cadence after the actions (docs/checks.md)
        self.maintenance = maintenance  # maintenance rollouts, moved on after the actions (docs/maintenance.md)
        self.tenancy = tenancy  # tenancy moves: handed over once their reprovision rollout is done (docs/tenancy.md)
        self.spares = spares  # hot-spare pools, after maintenance (docs/spares.md)
        self.cfg = controller.policy_file.config
        self.scheduler_ok = True
        self.last_error = ""
        self._seen: dict[str, SchedObservation] = {}
        # the last reason the scheduler showed for each node while it had it out (a resume erases it there;
        # a drift re-drain keeps it): in memory, so a restarted controller knows only what it has seen since
        self._out_reason: dict[str, str] = {}
        self._passes = 0
        self.sync_interval = timedelta(seconds=sync_interval)
        self._last_sync: datetime | None = None
        # Observers (controller.metrics): each pass's duration and attempted actions; each action's outcome
        # (done, waiting, retry, failed) with the controller's clock when it was recorded.
        self.on_pass: list[Callable[[float, int], None]] = []
        self.on_action: list[Callable[[OutboxAction, str, datetime], None]] = []
        # Whether this replica leads (controller.ha): a follower runs no pass, and a leader that loses the
        # lease mid-pass carries out no further action (what it writes is refused by the fence anyway).
        self.leading: Callable[[], bool] = lambda: True

    def reset(self) -> None:
        """Forget what earlier passes saw (a new leader epoch): the next pass reads the scheduler in full."""
        self._seen, self._passes, self._last_sync = {}, 0, None

    # ---- the loop ---------------------------------------------------------------------------
    def run_once(self) -> int:
        """One pass; returns how many actions were attempted."""
        started = time.perf_counter()
        now = self.controller.clock.now()
        last = self._last_sync
        sync_due = last is None or not timedelta(0) <= now - last < self.sync_interval  # a clock step back: read
        if sync_due and self.sync():  # a failed read is tried again on the next pass
            self._last_sync = now
        self.controller.tick()
        due = self.controller.store.due_actions(self.controller.clock.now())
        for row in due:
            if not self.leading():
                return 0
            self.execute(row)
        if self.maintenance is not None:
            self.maintenance.on_pass()
        if self.tenancy is not None:
            self.tenancy.on_pass()
        if self.spares is not None:
            self.spares.on_pass()
        if self.fleet_judge is not None:
            self.fleet_judge.on_pass()
        for observe in self.on_pass:
            observe(time.perf_counter() - started, len(due))
        return len(due)

    def run_forever(self, stop: threading.Event, interval: float = 1.0) -> None:
        # a database outage fails every pass alike: its first traceback, a count, one line when it is over
        failures = FailureLog(log, "reconciler pass")
        while not stop.is_set():
            try:
                if self.leading():
                    self.run_once()
                    failures.ok()
            except Exception as err:  # one bad pass never stops the loop
                failures.failed(err, f"; retrying every {interval:.1f}s")
            stop.wait(interval)

    def sync(self) -> bool:
        try:
            nodes = self.scheduler.list_nodes(jobs=False)  # the states say which nodes run jobs (no job list)
        except ExternalError as err:
            self._scheduler_down(err)
            return False
        self.scheduler_ok, self.last_error = True, ""
        observed = {
            n.name: SchedObservation(has_jobs=bool(n.jobs) or n.state in _BUSY,
                                     drained_empty=n.state == SchedNodeState.DRAINED,
                                     out_in_scheduler=_out_in_scheduler(n))
            for n in nodes
        }
        for n in nodes:
            if n.reason and observed[n.name].out_in_scheduler:
                self._out_reason[n.name] = n.reason
            elif n.name in self._out_reason and not observed[n.name].out_in_scheduler and self._serving(n.name):
                del self._out_reason[n.name]  # back in service for good: that reason is not a later drift's
        # Hand the controller only what changed since the last pass (the lock is shared with ingest),
        # and everything every FULL_SYNC_EVERY passes so nothing can be missed for long.
        self._passes += 1
        if self._passes % FULL_SYNC_EVERY == 1 or not self._seen:
            changed = observed
        else:
            changed = {n: o for n, o in observed.items() if self._seen.get(n) != o}
        self._seen = observed
        if changed:
            self.controller.sync(changed)
        if changed:  # a lost drain changes the observation, so only changed nodes need a look
            self._redrain_drift([n for n in nodes if n.name in changed])
        place_suspects_last(self.controller, self.scheduler, nodes)
        return True

    def _serving(self, node: str) -> bool:
        """Whether gpufleet has ``node`` in service (not held out, not unknown)."""
        try:
            return self.controller.state_of(node) not in HELD_OUT
        except NotFound:
            return False

    def _redrain_drift(self, nodes: Sequence[SchedNode]) -> None:
        """Nodes gpufleet holds out of service (drained, in repair, revalidating) must stay drained in the
        scheduler. If the scheduler lost the drain (slurmctld can forget one it acknowledged if it
        crashes before saving state) or someone resumed the node behind gpufleet's back, drain it again
        and say so in the audit log: a node nobody revalidated never quietly takes work. The reason keeps
        the one the node had while it was out (:func:`drift_reason`): an operator's note survives."""
        for n in nodes:
            if n.state not in (SchedNodeState.IDLE, SchedNodeState.ALLOCATED):
                continue
            try:
                state = self.controller.state_of(n.name)
            except NotFound:
                continue
            if state not in HELD_OUT or (self.validator is not None and self.validator.holds(n.name)):
                continue  # (a node validating in a maintenance reservation is undrained on purpose)
            before = self._out_reason.get(n.name, "")
            reason = drift_reason(state, before)
            detail = f"scheduler shows {n.name} {n.state} while gpufleet has it {state}: drained again"
            if before:
                detail += f", keeping the reason it had: {before!r}"
            try:
                self.scheduler.drain(n.name, reason)
            except (ExternalError, Conflict, NotFound) as err:
                log.error("%s: %s; the re-drain failed (%s). Manual action: drain it in the scheduler",
                          n.name, detail, err)
                continue
            log.warning("%s: %s", n.name, detail)
            self.controller.audit(n.name, "drift_redrain", detail)

    # ---- one action -------------------------------------------------------------------------
    def execute(self, row: OutboxAction) -> None:
        now = self.controller.clock.now()
        action = row.action
        try:
            outcome = self._carry_out(row, now)
        except ExternalError as err:
            self._retry(row, now, str(err))
            return
        except (Conflict, NotFound, InvalidInput) as err:
            self._give_up(row, now, f"{type(err).__name__}: {err}")
            return
        if outcome is None:  # waiting (for a checkpoint)
            self._observed(row, "waiting")
            return
        log.info("%s: %s done (%s)", action.node, action.kind, outcome)
        self.controller.action_finished(row.id, action, row.decision_id, result=outcome)
        self._observed(row, "done")

    def _observed(self, row: OutboxAction, outcome: str) -> None:
        if self.on_action:
            now = self.controller.clock.now()
            for observe in self.on_action:
                observe(row, outcome, now)

    def _carry_out(self, row: OutboxAction, now: datetime) -> str | None:
        kind, node = row.action.kind, row.action.node
        reason = drain_reason(row.decision_id, row.action.reason)
        if kind == ActionKind.DRAIN:
            self.scheduler.drain(node, reason)
            if self.validator is not None:
                self.validator.release(node)  # after the drain: nothing else lands on it meanwhile
            return "drained"
        if kind == ActionKind.DRAIN_AFTER_CHECKPOINT:
            return self._drain_after_checkpoint(row, reason, now)
        if kind == ActionKind.REQUEUE_JOBS:
            jobs = self.scheduler.jobs_on(node)
            for job in jobs:
                self.scheduler.requeue(job.id)
            return f"requeued {_ids(jobs) or 'nothing (no job running)'}"
        if kind == ActionKind.RESUME:
            if self.validator is not None:
                self.validator.release(node)
            self.scheduler.resume(node)
            return "resumed"
        if kind == ActionKind.VALIDATE:
            return self._validate(row, now)
        if kind == ActionKind.REPAIR:
            if self.repairer is None:
                return (f"no repair executor configured: with people (POST /v1/nodes/{node}/repair-complete "
                        "when fixed)")
            return self.repairer.carry_out(row, now)
        raise InvalidInput("action.kind", kind, f"one of {[k.value for k in ActionKind]}")

    def _validate(self, row: OutboxAction, now: datetime) -> str | None:
        """Start the validation run, follow it while the node is validating, and if the run ends
        without a verdict, say so as a failed check (the node goes back to repair, never stays stuck).

        The run is planned once (``lifecycle.validation.plan_validation``: a fabric fault is validated
        by pairing with known-good partners) and the plan, then the partners, are recorded in the
        action's progress before anything is reserved or submitted: a restart resumes the same run."""
        node = row.action.node
        if self.validator is None:
            return f"{row.action.level} validation requested: awaiting check results from the node"
        p = dict(row.progress)
        handle = p.get("validation", "")
        state = self.controller.state_of(node)
        if state not in VALIDATING:
            return f"node is {state}" + (f" (validation job {handle})" if handle else ": nothing to validate")
        if not p.get("level"):
            plan = plan_validation(row.action.level, fabric=fault_of(self.controller, node).fabric,
                                   partners=self.validator.partners)
            p = {"level": plan.level, "pairs": str(plan.partners)}
        level = p["level"]
        if p.get("unpair"):  # a re-pairing a crash interrupted: finish it (each step is idempotent)
            p, handle = self._unpair(row, p, now), ""
        if not handle:
            partners = tuple(x for x in p.get("partners", "").split(",") if x)
            if int(p.get("pairs", "0")) and not partners:
                partners = self._partners(node, int(p["pairs"]))
                if not partners:
                    self.controller.store.update_action(
                        row.id, status=ActionStatus.WAITING, now=now, next_attempt=now + self.cfg.checkpoint_poll,
                        progress=p, result=f"fabric fault: waiting for {p['pairs']} idle known-good partner(s) "
                                           "within the blast-radius budget")
                    return None
                p["partners"] = ",".join(partners)
                self.controller.store.update_action(row.id, status=ActionStatus.WAITING, now=now, next_attempt=now,
                                                    progress=p, result=f"pairing with {p['partners']}")
                self.controller.audit(node, "validation_partners", f"{level} validation pairs {node} with "
                                      f"known-good {p['partners']} (fabric fault)")
            handle = self.validator.request(node, level, row.id, partners)
            if not handle:
                return f"{level} validation started"
            with_ = f" with {p['partners']}" if p.get("partners") else ""
            self.controller.audit(node, "validation_job", f"{level} validation{with_}: job {handle} submitted")
            p["submitted"] = now.isoformat()
            run = RunStatus()
        else:
            run = self.validator.status(handle)
            ended = None if run.ended is None else f"{level} validation {run.ended} without a passing result"
            attrs: tuple[tuple[str, str], ...] = ()
            submitted = p.setdefault("submitted", now.isoformat())
            if p.get(NEVER_STARTED) and (run.pending or run.cancelled):
                # a cancel a crash (or a failed scancel) interrupted: finish it (cancel is idempotent)
                ended = self._never_started(node, handle, p[NEVER_STARTED], submitted, now)
            elif p.get(NEVER_STARTED):  # the cancel never took and the job started: follow the run it is
                del p[NEVER_STARTED]
                log.warning("%s: validation job %s started after all (its cancel never took): followed",
                            node, handle)
            elif (ended is None and run.pending
                    and now - datetime.fromisoformat(submitted) >= self.cfg.validation_start_timeout):
                busy = self._busy_partners(node, handle, p)
                if busy:
                    self._pair_again(row, p, handle, busy, run.pending, now)
                    return None
                p[NEVER_STARTED] = run.pending  # recorded before the cancel: a crash after it keeps the mark
                self.controller.store.update_action(row.id, status=ActionStatus.WAITING, now=now, next_attempt=now,
                                                    progress=p, result=f"validation job {handle} never started: "
                                                                       "cancelling it")
                ended = self._never_started(node, handle, run.pending, submitted, now)
            if p.get(NEVER_STARTED):
                # marked: a run that never started says nothing about the hardware (the repair ladder
                # does not count it as the fault coming back: controller.faults.never_ran, decision 0130)
                attrs = ((NEVER_STARTED, p[NEVER_STARTED]),)
            if ended is not None:
                self.controller.ingest([HealthEvent(
                    f"validation-ended:{row.id}", node, EventKind.CHECK_FAILED, now, source="validator",
                    severity=Severity.DEGRADED, message=ended, attrs=attrs)])
                return f"{ended}: back to repair"
        what = f"pending ({run.pending})" if run.pending else "running"
        self.controller.store.update_action(row.id, status=ActionStatus.WAITING, now=now,
                                            next_attempt=now + self.cfg.checkpoint_poll,
                                            progress={**p, "validation": handle},
                                            result=f"{level} validation job {handle} {what}")
        return None

    def _never_started(self, node: str, handle: str, pending: str, submitted: str, now: datetime) -> str:
        """A validation job still pending ``validation_start_timeout`` after it was submitted never gets the
        node (a drain by someone else, a partition down): cancel it and say why. The caller records the
        intent (``progress.never_started``) before the cancel, and the failure after it: a crash in between
        finds the mark and the job ended (or still pending: cancelled again, idempotent) and fails the
        validation as one that never ran, so the repair ladder does not climb. (A partner that is not free
        is not the node's failure: :meth:`_pair_again`.)"""
        waited = now - datetime.fromisoformat(submitted)
        waited -= timedelta(microseconds=waited.microseconds)  # said in whole seconds
        assert self.validator is not None
        self.validator.cancel(handle)
        why = (f"validation job {handle} never started: pending ({pending}) for {waited} after it was submitted "
               f"(validation_start_timeout {self.cfg.validation_start_timeout}); cancelled")
        log.warning("%s: %s", node, why)
        self.controller.audit(node, "validation_cancelled", why)
        return why

    def _busy_partners(self, node: str, handle: str, p: dict[str, str]) -> tuple[str, ...]:
        """The pairing partners (``p['partners']``) that keep validation job ``handle`` from starting: not
        idle in the scheduler, or running another job (one that landed on a partner between its choice
        and the reservation, which lets it finish: ``ignore_jobs``). Empty when the run has no partners, or
        when the node itself is not free (drained by someone else, down): then it is the node's validation
        that cannot run, and it fails (decision 0124)."""
        partners = [x for x in p.get("partners", "").split(",") if x]
        if not partners:
            return ()
        seen = {n.name: n for n in self.scheduler.list_nodes()}

        def free(name: str) -> bool:
            n = seen.get(name)
            return n is not None and n.state == SchedNodeState.IDLE and not set(n.jobs) - {handle}

        if not free(node):
            return ()
        return tuple(_busy(x, seen.get(x)) for x in partners if not free(x))

    def _pair_again(self, row: OutboxAction, p: dict[str, str], handle: str, busy: Sequence[str], pending: str,
                    now: datetime) -> None:
        """A pairing job that never started because a partner was not free says nothing about the node
        (nor the partner): cancel it and pair the node again with known-good partners that are free
        (decision 0130). The intent is recorded first (``progress.unpair``): a crash from here
        on finishes the re-pairing at the next pass and never reads the cancelled job as a failed run."""
        node = row.action.node
        why = (f"validation job {handle} never started: pending ({pending}) past validation_start_timeout "
               f"{self.cfg.validation_start_timeout}: partner(s) not free: {', '.join(busy)}; cancelled, not "
               f"failed: pairing {node} again")
        p = {k: v for k, v in p.items() if k not in ("validation", "submitted", "partners")}
        p["unpair"] = handle
        self.controller.store.update_action(row.id, status=ActionStatus.WAITING, now=now, next_attempt=now,
                                            progress=p, result=why)
        log.warning("%s: %s", node, why)
        self.controller.audit(node, "validation_partners_busy", why)
        self._unpair(row, p, now)

    def _unpair(self, row: OutboxAction, p: dict[str, str], now: datetime) -> dict[str, str]:
        """Cancel the job ``p['unpair']`` and forget it: the next pass chooses free partners and requests the
        run again (the validator's hold on the node stays: Slurm's reservation keeps other jobs off it and
        is set to the node and its new partners by that request, which lets the busy partner go)."""
        assert self.validator is not None
        node = row.action.node
        self.validator.cancel(p["unpair"])
        p = {k: v for k, v in p.items() if k != "unpair"}
        self.controller.store.update_action(row.id, status=ActionStatus.WAITING, now=now, next_attempt=now,
                                            progress=p, result=f"pairing {node} again with free known-good partners")
        return p

    def _partners(self, node: str, count: int) -> tuple[str, ...]:
        """Known-good partners that are idle in the scheduler now (LifecycleEngine.pairing_partners)."""
        idle = {n.name for n in self.scheduler.list_nodes() if n.state == SchedNodeState.IDLE and not n.jobs}
        return self.controller.pairing_partners(node, count, idle)

    def _drain_after_checkpoint(self, row: OutboxAction, reason: str, now: datetime) -> str | None:
        """Ask the node's job(s) to checkpoint, wait for the report within the GPU-hours budget
        (lifecycle.checkpoint), then drain and requeue. None while waiting."""
        node = row.action.node
        jobs = self.scheduler.jobs_on(node)
        if not jobs:
            self.scheduler.drain(node, reason)
            return "drained: no job running"
        ckpt = self._last_checkpoint(jobs)
        if ckpt is not None and ckpt > row.created:
            return self._drain_and_requeue(node, reason, jobs, f"after checkpoint at {ckpt.isoformat()}")
        wait = CheckpointWait.of_progress(row.progress, grace=self.cfg.checkpoint_grace,
                                          timeout=self.cfg.checkpoint_wait_timeout)
        if wait is None:
            wait = self._ask_for_checkpoint(row, jobs, ckpt, now)
        if now >= wait.deadline:
            why = (f"no checkpoint within {wait.deadline - wait.decided} "
                   f"({wait.at_risk(now):.1f} GPU-hours at risk, budget {wait.budget_gpu_hours:g})")
            return self._drain_and_requeue(node, reason, jobs, why)
        self.controller.store.update_action(
            row.id, status=ActionStatus.WAITING, now=now, progress=wait.progress(now),
            next_attempt=min(now + self.cfg.checkpoint_poll, wait.deadline),
            result=f"waiting for a checkpoint of job(s) {_ids(jobs)} until {wait.deadline.isoformat()}")
        return None

    def _ask_for_checkpoint(self, row: OutboxAction, jobs: Sequence[Job], ckpt: datetime | None,
                            now: datetime) -> CheckpointWait:
        """Record the request, then signal: a crash in between loses the signal (the deadline still
        holds) but never sends it twice."""
        starts = [j.start_time for j in jobs if j.start_time is not None]
        basis = ckpt or (min(starts) if starts else now)
        gpus = sum(job_gpus(j.gpus, len(j.nodes), self.cfg.gpus_per_node) for j in jobs)
        wait = CheckpointWait(row.created, now, tuple(j.id for j in jobs), gpus, basis, self.cfg.checkpoint_risk_budget,
                              self.cfg.checkpoint_grace, self.cfg.checkpoint_wait_timeout)
        # The request is audited with the wait it starts, in one transaction, before any signal: a
        # controller killed right after the signal still has both (the outcome follows, best effort).
        intent = AuditEntry(now, Actor.SYSTEM, "reconciler", "checkpoint_request", row.action.node,
                            f"asking job(s) {_ids(jobs)} to checkpoint: {gpus} GPUs, {wait.at_risk(now):.1f} "
                            f"GPU-hours at risk, budget {wait.budget_gpu_hours:g}; drain at "
                            f"{wait.deadline.isoformat()} at the latest")
        self.controller.store.update_action(row.id, status=ActionStatus.WAITING, now=now, next_attempt=now,
                                            progress=wait.progress(now),
                                            result=f"asking job(s) {_ids(jobs)} to checkpoint",
                                            plan=Plan(audit=[intent]))
        sent: dict[str, str] = {}  # job -> the signal it was sent ("" = it declared none: not asked)
        try:
            for job in jobs:
                try:
                    sent[job.id] = self.scheduler.request_checkpoint(job.id)
                except NotFound:  # the job ended meanwhile: the next poll drains the empty node
                    continue
        except ExternalError:
            self.controller.store.update_action(row.id, status=ActionStatus.PENDING, now=now, progress={})
            raise
        wait = replace(wait, signal=",".join(sorted({s for s in sent.values() if s})))
        self.controller.store.update_action(row.id, status=ActionStatus.WAITING, now=now, next_attempt=now,
                                            progress=wait.progress(now))
        asked = "; ".join(f"asked job {j} to checkpoint (SIG{s})" if s else
                          f"job {j} declared no checkpoint signal: not asked, drained at the deadline"
                          for j, s in sent.items()) or f"job(s) {_ids(jobs)} ended meanwhile"
        self.controller.audit(row.action.node, "checkpoint_signal", asked)
        return wait

    def _drain_and_requeue(self, node: str, reason: str, jobs: Sequence[Job], why: str) -> str:
        """Drain, then restart the node's jobs elsewhere from the checkpoint they just wrote."""
        self.scheduler.drain(node, reason)
        for job in jobs:
            self.scheduler.requeue(job.id)
        return f"drained {why}; requeued {_ids(jobs)}"

    def _last_checkpoint(self, jobs: Sequence[Job]) -> datetime | None:
        times = [j.last_checkpoint for j in jobs if j.last_checkpoint is not None]
        stored = self.controller.store.last_checkpoint([j.id for j in jobs])
        if stored is not None:
            times.append(stored)
        return max(times, default=None)

    def _retry(self, row: OutboxAction, now: datetime, error: str) -> None:
        attempts = row.attempts + 1
        if attempts >= self.cfg.max_attempts:
            self._give_up(row, now, f"{error} (after {attempts} attempts)")
            return
        delay = backoff(row.id, attempts, self.cfg.retry_base, self.cfg.retry_cap)
        log.warning("%s: %s failed (attempt %d), retrying in %s: %s",
                    row.action.node, row.action.kind, attempts, delay, error)
        self.controller.store.update_action(row.id, status=ActionStatus.PENDING, now=now, attempts=attempts,
                                            next_attempt=now + delay, error=error)
        self._observed(row, "retry")

    def _give_up(self, row: OutboxAction, now: datetime, error: str) -> None:
        log.error("%s: giving up on %s (%s). Manual action: check the node in the scheduler, fix the cause, "
                  "then retry it with POST /v1/actions/%s/retry", row.action.node, row.action.kind, error, row.id)
        self.controller.store.update_action(row.id, status=ActionStatus.FAILED, now=now,
                                            attempts=row.attempts + 1, error=error)
        self._observed(row, "failed")

    def _scheduler_down(self, err: ExternalError) -> None:
        if self.scheduler_ok:
            log.warning("scheduler unreachable: %s (actions stay queued and are retried)", err)
        self.scheduler_ok, self.last_error = False, str(err)


def backoff(key: str, attempt: int, base: timedelta, cap: timedelta) -> timedelta:
    """Capped exponential backoff with deterministic jitter in [50 %, 100 %] of the step."""
    step = min(cap.total_seconds(), base.total_seconds() * 2 ** max(0, attempt - 1))
    jitter = int(hashlib.sha1(f"{key}:{attempt}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return timedelta(seconds=step * (0.5 + 0.5 * jitter))


def _ids(jobs: Sequence[Job]) -> str:
    return ", ".join(j.id for j in jobs)
