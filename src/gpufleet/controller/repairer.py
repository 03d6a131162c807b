"""Carries out ``repair`` actions: climbs the escalation ladder (lifecycle.repair) through executors.

One ``repair`` outbox action per stay in ``repair``. Each pass (crash-safe: every step is recorded in
the action's ``progress`` *before* it is started, and executors are idempotent on the step's key):

1. no step in progress: find the fault the node is being repaired for (the decision that took it
   out), read the node's repair history, pick the next rung (``next_step``), record it, audit it,
   start it (agent command or ticket);
2. a step in progress: ask its executor for the outcome; none yet: wait (``checkpoint_poll``), and
   past ``step_timeout`` abandon it as failed;
3. the outcome is recorded in the repair log (what the ladder counts) and audited. A successful
   reset / reboot / fabric-manager restart moves the node repair -> revalidate (a validation job then
   returns it to service: no human step); a failed one climbs to the next rung on the next pass; a
   ticket ends automation: the node waits in ``repair`` for people (``repair-complete`` or ``retire``).

A restarted controller resumes the step recorded in ``progress``: it never queues a second command
for the same step nor files the same ticket under a new id.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta

from gpufleet.domain.catalog import Action
from gpufleet.lifecycle.plan import OutboxAction
from gpufleet.lifecycle.repair import AGENT_STEPS, Fault, RepairStep, next_step
from gpufleet.lifecycle.states import NodeState
from gpufleet.lifecycle.validation import level_after

from .executors.port import Executor, StepOutcome, StepRequest
from .faults import fault_of
from .service import Controller
from .store.repairs import RepairStore
from .store.repo import ActionStatus

log = logging.getLogger(__name__)
_WITH_PEOPLE = "with people: POST /v1/nodes/{node}/repair-complete when fixed, or retire it"


class Repairer:
    def __init__(self, controller: Controller, executors: Mapping[str, Executor]) -> None:
        """``executors``: ``agent`` (GPU reset, reboot, fabric manager) and/or ``ticket``; a step with
        no executor configured hands the node to people through the audit log only."""
        self.c = controller
        self.repairs = RepairStore(controller.store)
        self.executors = dict(executors)
        self.cfg = controller.policy_file.config

    def carry_out(self, row: OutboxAction, now: datetime) -> str | None:
        node = row.action.node
        state = self.c.state_of(node)
        if state != NodeState.REPAIR:
            return f"node is {state}: nothing to repair"
        p = dict(row.progress)
        if not p.get("key"):
            p = self._choose(row, p, now)
        step = RepairStep(p["step"])
        ex = self._executor(step)
        req = self._request(node, p)
        if ex is None:
            outcome = StepOutcome(step == RepairStep.TICKET, f"no {_kind(step)} executor configured")
        else:
            if not p.get("sent"):
                ex.start(req)  # ExternalError: retried with the same key (the progress is kept)
                p["sent"] = "1"
                self._wait(row.id, p, now, f"{step} started ({p['key']})")
            got = ex.outcome(p["key"])
            if got is None:
                if now - datetime.fromisoformat(p["started"]) < self.cfg.step_timeout:
                    self._wait(row.id, p, now, f"waiting for {step} on {node} ({p['key']})")
                    return None
                got = ex.abandon(p["key"]) or StepOutcome(False, "no result")
                if not got.ok:
                    got = StepOutcome(False, f"no result within {self.cfg.step_timeout} ({got.detail})")
            outcome = got
        return self._finish(row, p, step, outcome, now)

    # ---- one rung ---------------------------------------------------------------------------
    def _choose(self, row: OutboxAction, p: dict[str, str], now: datetime) -> dict[str, str]:
        node = row.action.node
        fault = fault_of(self.c, node)
        since = now - max(self.cfg.lemon_window, self.cfg.reboot_window)
        nxt = next_step(fault, self.repairs.history(node, since), now, self.cfg)
        attempt = int(p.get("attempt", "0")) + 1
        chosen = {"attempt": str(attempt), "key": f"{row.id}:{attempt}:{nxt.step}", "step": nxt.step.value,
                  "fault": fault.key, "fault_action": fault.action.value, "fault_text": fault.text[:300],
                  "why": nxt.reason, "lemon": "1" if nxt.lemon else "", "started": now.isoformat()}
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
        self._wait(row.id, {"attempt": p["attempt"]}, now, f"{step} failed: {outcome.detail}; choosing the next step")
        return None

    # ---- helpers ----------------------------------------------------------------------------
    def _executor(self, step: RepairStep) -> Executor | None:
        return self.executors.get("agent" if step in AGENT_STEPS else "ticket")

    def _request(self, node: str, p: Mapping[str, str]) -> StepRequest:
        history = tuple(self.repairs.history(node, datetime.fromisoformat(p["started"]) - self.cfg.lemon_window))
        fault = Fault(p["fault"], Action(p["fault_action"]), p.get("fault_text", ""))
        return StepRequest(p["key"], node, RepairStep(p["step"]), fault, p["why"], datetime.fromisoformat(p["started"]),
                           lemon=bool(p.get("lemon")), history=history)

    def _wait(self, action_id: str, progress: Mapping[str, str], now: datetime, result: str) -> None:
        self.c.store.update_action(action_id, status=ActionStatus.WAITING, now=now, progress=progress,
                                   next_attempt=now + min(self.cfg.checkpoint_poll, timedelta(seconds=30)),
                                   result=result)


def _kind(step: RepairStep) -> str:
    return "agent" if step in AGENT_STEPS else "ticket"

