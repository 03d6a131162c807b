"""Carries out ``repair`` actions: climbs the escalation ladder (lifecycle.repair) through executors.

One ``repair`` outbox action per stay in ``repair``. Each pass (crash-safe: every step is recorded in
the action's ``progress`` *before* it is started, and executors are idempotent on the step's key):

1. no step in progress: find the fault the node is being repaired for (the decision that took it
   out), read the node's repair history, pick the next rung (``next_step``), record it, audit it,
   start it (agent command, BMC power cycle or ticket). A ``start`` that fails with a retryable
   ExternalError (an unreachable BMC) is retried ``start_tries`` times with backoff (``retry_base``
   doubling), then the step counts as failed and the next rung (a ticket) is chosen;
2. a step in progress: ask its executor for the outcome; none yet: wait (``checkpoint_poll``), and
   past ``step_timeout`` abandon it as failed;
3. the outcome is recorded in the repair log (what the ladder counts) and audited. A successful
   reset / reboot / fabric-manager restart moves the node repair -> revalidate (a validation job then
   returns it to service: no human step); a failed one climbs to the next rung on the next pass; a
   ticket ends automation: the node waits in ``repair`` for people (``repair-complete`` or ``retire``).

A node sent to repair by a validation job that never started (cancelled at ``validation_start_timeout``:
the node drained by hand, its partition down) gets no rung: that run says nothing about the fault, so it
is not the fault coming back. The action ends at once, nothing is added to the repair log (the ladder
stays where it was), and the node waits in ``repair`` for people, who fix what kept the job from starting
and run ``repair-complete`` (decision 0130).

Before the first rung, with the agent executor and ``bundle`` on, the node's agent captures a
diagnostic bundle (controller.bundles) — a reset or reboot destroys what an RMA asks about; the
repairer waits for it at most ``bundle_timeout`` and goes on without it after that.

A restarted controller resumes the step recorded in ``progress``: it never queues a second command
for the same step nor files the same ticket under a new id.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta

from gpufleet.domain.catalog import Action
from gpufleet.domain.errors import ExternalError
from gpufleet.lifecycle.plan import OutboxAction
from gpufleet.lifecycle.repair import AGENT_STEPS, BMC_STEPS, Fault, RepairStep, next_step
from gpufleet.lifecycle.states import NodeState
from gpufleet.lifecycle.validation import level_after

from .executors.port import Executor, StepOutcome, StepRequest
from .faults import fault_of, never_ran
from .service import Controller
from .store.bundles import BundleStore
from .store.repairs import CommandStatus, RepairStore
from .store.repo import ActionStatus

log = logging.getLogger(__name__)
_WITH_PEOPLE = "with people: POST /v1/nodes/{node}/repair-complete when fixed, or retire it"


class Repairer:
    def __init__(self, controller: Controller, executors: Mapping[str, Executor], *, start_tries: int = 5,
                 retry_base: timedelta = timedelta(seconds=10),
                 retry_cap: timedelta = timedelta(minutes=5), bundle: bool = False,
                 bundle_timeout: timedelta = timedelta(minutes=10)) -> None:
        """``executors``: ``agent`` (GPU reset, reboot, fabric manager), ``bmc`` (power cycle) and/or
        ``ticket``; a step with no executor configured hands the node to people through the audit log
        only. ``start_tries``: attempts at starting a step whose executor is unreachable before the
        step counts as failed (the ticket webhook is retried for ever instead: it is the last rung)."""
        self.c = controller
        self.repairs = RepairStore(controller.store)
        self.executors = dict(executors)
        self.cfg = controller.policy_file.config
        self.start_tries, self.retry_base, self.retry_cap = start_tries, retry_base, retry_cap
        self.bundle, self.bundle_timeout = bundle and "agent" in self.executors, bundle_timeout
        self.bundles = BundleStore(controller.store)

    def carry_out(self, row: OutboxAction, now: datetime) -> str | None:
        node = row.action.node
        state = self.c.state_of(node)
        if state != NodeState.REPAIR:
            return f"node is {state}: nothing to repair"
        p = dict(row.progress)
        if not p.get("key"):
            unrun = never_ran(self.c, row.decision_id)
            if unrun:
                return self._not_climbed(node, unrun)
            if self._capturing(row, p, now):
                return None
            p = self._choose(row, p, now)
        step = RepairStep(p["step"])
        ex = self._executor(step)
        req = self._request(node, p)
        if ex is None:
            outcome = StepOutcome(step == RepairStep.TICKET, f"no {_kind(step)} executor configured")
        else:
            if not p.get("sent"):
                try:
                    ex.start(req)  # ExternalError: retried with the same key (the progress is kept)
                except ExternalError as err:
                    if step == RepairStep.TICKET or not err.retryable:
                        raise
                    return self._start_failed(row, p, step, err, now)
                p["sent"] = "1"
                self._wait(row.id, p, now, f"{step} started ({p['key']})")
            got = ex.outcome(req)
            if got is None:
                if now - datetime.fromisoformat(p["started"]) < self.cfg.step_timeout:
                    self._wait(row.id, p, now, f"waiting for {step} on {node} ({p['key']})")
                    return None
                got = ex.abandon(req) or StepOutcome(False, "no result")
                if not got.ok:
                    got = StepOutcome(False, f"no result within {self.cfg.step_timeout} ({got.detail})")
            outcome = got
        return self._finish(row, p, step, outcome, now)

    def _not_climbed(self, node: str, unrun: str) -> str:
        """The node is in repair because its validation never ran (``unrun``: why): no rung, with people."""
        fault = fault_of(self.c, node)
        why = (f"no repair step: the validation never ran ({unrun}), so it says nothing about {fault.key}; the "
               f"ladder stays where it was (not counted as the fault coming back)")
        log.warning("%s: %s. Manual action: fix what kept the validation job from starting, then "
                    "POST /v1/nodes/%s/repair-complete", node, why, node)
        self.c.audit(node, "repair_not_climbed", why, actor_id="repairer")
        return (f"{why}; with people: fix what kept the job from starting, then "
                f"POST /v1/nodes/{node}/repair-complete (revalidates it)")

    # ---- the diagnostic bundle, before the first rung -----------------------------------------
    def _capturing(self, row: OutboxAction, p: dict[str, str], now: datetime) -> bool:
        """Queue / wait for the bundle capture; False once it is over (``p`` says how it ended)."""
        if not self.bundle or p.get("bundle_done"):
            return False
        node = row.action.node
        key = p.get("bundle")
        if not key:
            key = f"{row.id}:bundle"
            p.update(bundle=key, bundle_started=now.isoformat())
            self._wait(row.id, p, now, f"capturing a diagnostic bundle ({key}) before the first repair step")
            self.repairs.enqueue(key, node, "diagnostic_bundle", now)
            self.c.audit(node, "bundle_requested", f"diagnostic_bundle ({key}): captured before any repair step",
                         actor_id="repairer")
            return True
        cmd = self.repairs.command(key)
        if cmd is not None and cmd.status == CommandStatus.QUEUED:
            if now - datetime.fromisoformat(p["bundle_started"]) < self.bundle_timeout:
                self._wait(row.id, p, now, f"waiting for the diagnostic bundle ({key})")
                return True
            cmd = self.repairs.expire(key, now)
        p["bundle_done"] = cmd.status if cmd is not None else "lost"
        if p["bundle_done"] == CommandStatus.SUCCEEDED and self.bundles.info(key) is None:
            p["bundle_done"] = "not uploaded"  # the agent said done but the controller has no bundle
        if p["bundle_done"] != CommandStatus.SUCCEEDED:
            log.warning("%s: no diagnostic bundle (%s): repairing without it", node, p["bundle_done"])
        return False

    # ---- one rung ---------------------------------------------------------------------------
    def _choose(self, row: OutboxAction, p: dict[str, str], now: datetime) -> dict[str, str]:
        node = row.action.node
        fault = fault_of(self.c, node)
        since = now - max(self.cfg.lemon_window, self.cfg.reboot_window)
        bmc = self.executors.get("bmc")
        has_bmc = bmc is not None and bool(getattr(bmc, "has", lambda _n: True)(node))
        nxt = next_step(fault, self.repairs.history(node, since), now, self.cfg, bmc=has_bmc)
        attempt = int(p.get("attempt", "0")) + 1
        chosen = {"attempt": str(attempt), "key": f"{row.id}:{attempt}:{nxt.step}", "step": nxt.step.value,
                  "fault": fault.key, "fault_action": fault.action.value, "fault_text": fault.text[:300],
                  "why": nxt.reason, "lemon": "1" if nxt.lemon else "", "started": now.isoformat(),
                  **_bundle_fields(p)}
        # Recorded before anything is started: a crash from here on resumes this very step.
        self._wait(row.id, chosen, now, f"{nxt.step}: {nxt.reason}")
        self.c.audit(node, "repair_step", f"{nxt.step} ({chosen['key']}): {nxt.reason}", actor_id="repairer")
        if nxt.lemon:
            log.warning("%s: %s", node, nxt.reason)
            self.c.audit(node, "lemon_node", nxt.reason, actor_id="repairer")
        return chosen

    def _finish(self, row: OutboxAction, p: dict[str, str], step: RepairStep, outcome: StepOutcome,
                now: datetime) -> str | None:
        node, key = row.action.node, p["key"]
        self.repairs.record(key, node, now, p["fault"], step, outcome.ok, outcome.detail)
        verdict = "succeeded" if outcome.ok else "failed"
        self.c.audit(node, "repair_result", f"{step} ({key}) {verdict}: {outcome.detail}", actor_id="repairer")
        if step == RepairStep.TICKET:
            what = "retire recommended" if p.get("lemon") else "hardware ticket"
            log.error("%s: %s: %s (%s). Manual action: %s", node, what, p["why"], outcome.detail,
                      _WITH_PEOPLE.format(node=node))
            return f"{what} ({key}): {p['why']}; {outcome.detail}; {_WITH_PEOPLE.format(node=node)}"
        if outcome.ok:
            log.info("%s: %s succeeded (%s): revalidating", node, step, outcome.detail)
            self.c.repair_succeeded(node, step.value, level_after(step), key)
            return f"{step} succeeded ({outcome.detail}): revalidating"
        log.warning("%s: %s failed (%s): next rung", node, step, outcome.detail)
        self._wait(row.id, {"attempt": p["attempt"], **_bundle_fields(p)}, now,
                   f"{step} failed: {outcome.detail}; choosing the next step")
        return None

    def _start_failed(self, row: OutboxAction, p: dict[str, str], step: RepairStep, err: ExternalError,
                      now: datetime) -> str | None:
        """An executor could not start the step (BMC unreachable): back off and try again, or, after
        ``start_tries``, count the step as failed (the ladder goes on)."""
        node, tries = row.action.node, int(p.get("start_tries", "0")) + 1
        if tries >= self.start_tries:
            outcome = StepOutcome(False, f"{_kind(step)} unreachable after {tries} tries: {err}")
            return self._finish(row, p, step, outcome, now)
        p = {**p, "start_tries": str(tries), "last_error": str(err)[:300]}
        delay = min(self.retry_cap, self.retry_base * 2 ** (tries - 1))
        log.warning("%s: %s could not start (try %d of %d, again in %s): %s", node, step, tries,
                    self.start_tries, delay, err)
        self.c.store.update_action(row.id, status=ActionStatus.WAITING, now=now, progress=p, next_attempt=now + delay,
                                   result=f"{step}: try {tries} of {self.start_tries} failed ({err}); again in {delay}")
        return None

    # ---- helpers ----------------------------------------------------------------------------
    def _executor(self, step: RepairStep) -> Executor | None:
        return self.executors.get(_kind(step))

    def _request(self, node: str, p: Mapping[str, str]) -> StepRequest:
        history = tuple(self.repairs.history(node, datetime.fromisoformat(p["started"]) - self.cfg.lemon_window))
        fault = Fault(p["fault"], Action(p["fault_action"]), p.get("fault_text", ""))
        return StepRequest(p["key"], node, RepairStep(p["step"]), fault, p["why"], datetime.fromisoformat(p["started"]),
                           lemon=bool(p.get("lemon")), history=history,
                           bundle=p["bundle"] if p.get("bundle_done") == CommandStatus.SUCCEEDED else "")

    def _wait(self, action_id: str, progress: Mapping[str, str], now: datetime, result: str) -> None:
        self.c.store.update_action(action_id, status=ActionStatus.WAITING, now=now, progress=progress,
                                   next_attempt=now + min(self.cfg.checkpoint_poll, timedelta(seconds=30)),
                                   result=result)


def _kind(step: RepairStep) -> str:
    return "agent" if step in AGENT_STEPS else "bmc" if step in BMC_STEPS else "ticket"



def _bundle_fields(p: Mapping[str, str]) -> dict[str, str]:
    return {k: p[k] for k in ("bundle", "bundle_started", "bundle_done") if k in p}
