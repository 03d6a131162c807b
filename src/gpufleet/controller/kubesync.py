"""The controller's side of the ``GPUNode`` resources (docs/kubernetes.md): its store's node states
published after every reconciler pass, and ``spec.maintenance: true`` taken as an operator's drain.

The Kubernetes side (the objects, the API calls) is ``schedulers/kubernetes/gpunodes.py``; this module
only decides what to show and what a maintenance request does, so the controller never imports the
Kubernetes client. :class:`NodeView` is the controller's value; the CRD's ``GPUNodeStatus`` is the wire
shape of the same facts, built from it in one place (``cli/controller.gpunode_sync``) — the import
contract keeps ``schedulers.kubernetes`` out of the controller, so the two cannot be one type.

What a node shows: its lifecycle state and since when, the reason and evidence of
its latest transition, and the standing correlation verdicts that name it. Only nodes whose state
changed since the last pass cost a store read (one query for all of them). A maintenance request drains
a node that is serving (``ready``, ``in_service``, ``suspect``) once, audited under the actor
``gpunode-spec``; clearing the flag does not resume the node — returning it stays an operator's act.
Every action the reconciler carries out is recorded as a ``Remediation`` (``on_action``): created when
first tried, its phase, attempts, last error and result updated as the outbox moves it on.
A failing API server is logged and retried at the next pass; it never stops the reconciler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from gpufleet.correlate.model import SuspectAction
from gpufleet.domain.errors import Conflict, GpufleetError
from gpufleet.domain.events import LINK_KINDS, EventKind
from gpufleet.lifecycle.decisions import ActionKind
from gpufleet.lifecycle.engine import OperatorOp
from gpufleet.lifecycle.plan import OutboxAction
from gpufleet.lifecycle.states import SCHEDULABLE, NodeState

from .service import Controller

log = logging.getLogger(__name__)
ACTOR = "gpunode-spec"


@dataclass(frozen=True, slots=True)
class Verdict:
    component: str
    kind: str
    confidence: float
    action: SuspectAction


@dataclass(frozen=True, slots=True)
class RemediationView:
    """One outbox action as its ``Remediation`` resource shows it."""

    action_id: str
    node: str
    kind: str  # ActionKind value
    decision: str
    reason: str
    requested_at: datetime
    phase: str  # pending | waiting | done | failed (the outbox's statuses)
    attempts: int
    last_error: str
    result: str
    finished_at: datetime | None


# Node conditions per fault class (``Gpufleet<Class>Healthy``, True = healthy, like GpufleetHealthy):
# the classes of a drain's evidence go False when the drain is done, and all go True when the node is
# returned to service.
FAULT_CLASSES: dict[str, frozenset[EventKind]] = {
    "GPU": frozenset({EventKind.XID, EventKind.ECC_SBE, EventKind.ECC_DBE, EventKind.ROW_REMAP_PENDING,
                      EventKind.ROW_REMAP_FAILURE, EventKind.THERMAL, EventKind.GPU_LOST}),
    "Fabric": frozenset({EventKind.SXID, *LINK_KINDS}),
    "PCIe": frozenset({EventKind.AER_CORRECTED, EventKind.AER_UNCORRECTED}),
    "Validation": frozenset({EventKind.CHECK_FAILED}),
    "Agent": frozenset({EventKind.HEARTBEAT_LOST}),
}


def condition_type(fault_class: str) -> str:
    return f"Gpufleet{fault_class}Healthy"


def fault_classes(kinds: Iterable[str]) -> list[str]:
    """The fault classes of events of these kinds, in FAULT_CLASSES order."""
    got = set(kinds)
    return [c for c, members in FAULT_CLASSES.items() if any(k.value in got for k in members)]


# The reconciler's outcomes -> the outbox status they leave the action in.
_PHASE = {"done": "done", "waiting": "waiting", "retry": "pending", "failed": "failed"}


@dataclass(frozen=True, slots=True)
class NodeView:
    state: NodeState
    since: datetime
    reason: str = ""
    evidence: tuple[str, ...] = ()
    verdicts: tuple[Verdict, ...] = ()


class GpuNodeSync:
    def __init__(self, controller: Controller, publish: Callable[[Mapping[str, NodeView]], int],
                 maintenance: Callable[[], Mapping[str, str]],
                 remediation: Callable[[RemediationView], None] | None = None,
                 condition: Callable[[str, str, bool, str, str], None] | None = None) -> None:
        self.controller, self._publish, self._maintenance = controller, publish, maintenance
        self._remediation, self._condition = remediation, condition
        self._views: dict[str, NodeView] = {}
        self._drained: set[str] = set()  # maintenance requests already acted on (until the flag clears)

    def run_pass(self, *_: object) -> None:
        """One pass (a reconciler ``on_pass`` observer): publish, then act on maintenance requests."""
        try:
            self._publish(self.views())
            self._act(self._maintenance())
        except GpufleetError as err:
            log.warning("GPUNode resources not updated this pass (%s); trying again at the next", err)

    def on_action(self, row: OutboxAction, outcome: str, now: datetime) -> None:
        """A reconciler ``on_action`` observer: the action's ``Remediation`` resource, as the outbox has it,
        and the node's fault-class conditions when a drain or a resume is done."""
        if outcome == "done" and self._condition is not None:
            try:
                self._conditions(row)
            except GpufleetError as err:
                log.warning("conditions of %s not written (%s)", row.action.node, err)
        if self._remediation is None or outcome not in _PHASE:
            return
        stored = self.controller.store.action(row.id)
        phase = _PHASE[outcome]
        view = RemediationView(
            row.id, row.action.node, row.action.kind.value, row.decision_id, row.action.reason, row.created, phase,
            stored.attempts if stored is not None else row.attempts,
            stored.last_error if stored is not None else "", stored.result if stored is not None else "",
            now if phase in ("done", "failed") else None)
        try:
            self._remediation(view)
        except GpufleetError as err:
            log.warning("Remediation for %s not recorded (%s)", row.id, err)

    def _conditions(self, row: OutboxAction) -> None:
        assert self._condition is not None
        node, kind = row.action.node, row.action.kind
        if kind == ActionKind.DRAIN:
            d = self.controller.store.decision(row.decision_id)
            if d is None:
                return
            for cls in fault_classes(self.controller.store.event_kinds(node, (str(e) for e in d.evidence))):
                self._condition(node, condition_type(cls), False, "GpufleetFault", d.reason[:1000])
        elif kind == ActionKind.RESUME:
            for cls in FAULT_CLASSES:
                self._condition(node, condition_type(cls), True, "GpufleetResumed", "returned to service by gpufleet")

    def views(self) -> dict[str, NodeView]:
        c = self.controller
        with c.lock:
            states = {n: (r.state, r.since) for n, r in c.engine.nodes.items()}
            verdicts: dict[str, list[Verdict]] = {}
            for s in c.verdicts:
                for n in s.affected_nodes:
                    verdicts.setdefault(n, []).append(Verdict(s.component, s.kind, round(s.confidence, 3), s.action))
        changed = [n for n, (st, since) in states.items()
                   if (v := self._views.get(n)) is None or (v.state, v.since) != (st, since)]
        last = c.store.last_transitions() if changed else {}
        for n in changed:
            t = last.get(n)
            st, since = states[n]
            self._views[n] = NodeView(st, since, t.reason if t is not None else "",
                                      tuple(str(e) for e in (t.evidence if t is not None else ())))
        for n in set(self._views) - set(states):
            del self._views[n]
        return {n: NodeView(v.state, v.since, v.reason, v.evidence, tuple(verdicts.get(n, ())))
                for n, v in self._views.items()}

    def _act(self, requests: Mapping[str, str]) -> None:
        self._drained &= set(requests)  # a cleared flag may be set again later
        for node, why in sorted(requests.items()):
            if node in self._drained or node not in self.controller.engine.nodes:
                continue
            if self.controller.state_of(node) not in SCHEDULABLE:
                self._drained.add(node)  # already out: nothing to do
                continue
            try:
                self.controller.operate(node, OperatorOp.DRAIN, ACTOR, f"spec.maintenance: {why or 'requested'}")
            except Conflict as err:
                log.info("GPUNode %s asks for maintenance: %s", node, err)
            self._drained.add(node)
