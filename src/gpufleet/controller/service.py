"""The controller: the lifecycle engine, its store and a clock, behind one lock.

Every entry point validates first, then lets the engine decide, then persists the resulting plan in
one transaction. In-memory state is transactional too (:meth:`Controller._atomic`): if anything in an
entry point fails — the write, a refused operation, the reload after it — what the engine and the
admission changed is rolled back without reading the database, so memory never runs ahead of what is
durable, even while the database cannot be read either.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence, Set
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy.exc import SQLAlchemyError

from gpufleet.correlate.engine import Engine
from gpufleet.correlate.model import Basis, Suspect, SuspectAction, Verdict, VerdictStatus, Watched
from gpufleet.correlate.offenders import REPEAT_WINDOW
from gpufleet.domain.errors import Conflict, ExternalError, GpufleetError, InvalidInput, NotFound
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.fleet import Fleet, Node
from gpufleet.domain.inventory import NodeInventory
from gpufleet.domain.topology import Topology
from gpufleet.lifecycle.breaker import BreakerState
from gpufleet.lifecycle.config import PolicyFile
from gpufleet.lifecycle.decisions import ComponentFault, DecisionStatus, PlannedAction
from gpufleet.lifecycle.engine import LifecycleEngine, NodeRecord, OperatorOp, SchedObservation
from gpufleet.lifecycle.plan import AuditEntry, Plan
from gpufleet.lifecycle.policy import Policy
from gpufleet.lifecycle.states import Actor, NodeState

from . import gaps, heap
from .admission import Admission
from .clock import Clock
from .failurelog import FailureLog
from .identity import Identity
from .store.db import brief
from .store.namings import NamingStore
from .store.repo import EventKey, IngestRound, Round, Store

MAX_CLOCK_SKEW = timedelta(minutes=5)
# An agent clock this far off ours (at its last heartbeat) has its events' times corrected before they are
# judged; below it the difference is network latency and NTP jitter, left alone.
SKEW_CORRECTED_S = 1.0
_NO_DRAIN = frozenset({SuspectAction.OBSERVE, SuspectAction.ISOLATE_SWITCH})
# Findings the per-node policy cannot reach from one node's events: weak signals only (each event is
# informational), a pattern that followed its unit or stayed at its slot across a move.
_BEYOND_EVENTS = frozenset({Basis.DEGRADING, Basis.FOLLOWS_SERIAL, Basis.STAYS_AT_SLOT})

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    node: str
    time: datetime
    version: str = ""


@dataclass(frozen=True, slots=True)
class IngestResult:
    accepted: int
    duplicates: int
    decisions: int


class Controller:
    def __init__(self, store: Store, policy: PolicyFile, clock: Clock, *, topology: Topology | None = None) -> None:
        # a database outage fails every write alike (each agent's round, each plan): counted, not a flood
        self._writes = FailureLog(log, "writing to the database")
        self.store = store
        self.policy_file = policy
        self.clock = clock
        # With a topology, every event also goes through the correlation engine; a verdict that blames
        # a shared component (leaf, NVSwitch, cable, tray) drains the nodes behind it as one decision.
        self.correlator: Engine | None = None
        self.namings = NamingStore(store)  # the correlator's repeat-offender history
        self.verdicts: list[Suspect] = []
        self.topology = topology
        self.lock = threading.RLock()
        # Agents' local names (GPU index, PCI address, HCA) -> topology ids; serials seen at new slots.
        self.identity = Identity(self.topology)
        self.identity.load(self.store.load_inventories(), self.store.load_references())
        self.admission = self._admission()
        self.engine = self._load(self.admission)
        self._warn_unplaced(self.engine.nodes, "registered")
        # The correlation window is rebuilt from the store: a restart keeps its evidence.
        self._correlator_stale = True
        self._rebuild_correlator()
        self.on_plan: list[Callable[[Plan], None]] = []  # observers (the demo's live view)
        self.max_clock_skew = MAX_CLOCK_SKEW  # how far ahead of our clock a reported time may be
        self.clock_skew: dict[str, float] = {}  # node -> its agent's clock minus ours at its last heartbeat (s)
        self._skewed: dict[str, timedelta] = {}  # the nodes whose skew is corrected (>= SKEW_CORRECTED_S)
        self._not_silence: set[str] = set()  # held decisions a returning agent does not cancel (_heard_again)
        self.gaps_told: dict[str, datetime] = {}  # node -> when its missing units were last told (gaps.py)
        # Nodes a maintenance rollout holds (controller.maintenance keeps it; the time-driven rules skip them).
        self.under_maintenance: set[str] = set()

    # ---- inventory --------------------------------------------------------------------------
    def register(self, nodes: Iterable[Node], *, state: NodeState = NodeState.NEW, actor_id: str = "system") -> int:
        """Register nodes not yet known (known ones are left as they are). Returns how many were added."""
        with self.lock, self._atomic():
            now = self.clock.now()
            plan, added = Plan(), []
            for node in nodes:
                if node.id in self.engine.nodes:
                    continue
                plan.extend(self.engine.add_node(node.id, node.domains, state, now, actor_id))
                added.append((self.engine.nodes[node.id], node.rack, now))
            if added:
                self._persist(plan, new_nodes=added)
        self._warn_unplaced([rec.node for rec, _rack, _t in added], "just registered")
        if len(added) >= heap.SETTLE_AFTER_NODES:
            heap.settle(f"registering {len(added)} nodes")
        return len(added)

    def _warn_unplaced(self, nodes: Iterable[str], which: str) -> list[str]:
        """Warn when nodes the controller manages are not in its topology: their events are judged per
        node but never correlated (the topology must name nodes as the scheduler and agents do).
        Returns those nodes."""
        if self.topology is None:
            return []
        ids = list(nodes)
        missing = sorted(n for n in ids if n not in self.topology.components)
        if missing:
            log.warning("%d of the %d nodes %s are not in the topology (%s%s): their events are never "
                        "correlated; topology_file must name nodes as the scheduler does (docs/correlate.md)",
                        len(missing), len(ids), which, ", ".join(missing[:5]), ", ..." if len(missing) > 5 else "")
        return missing

    def register_fleet(self, fleet: Fleet, state: NodeState = NodeState.READY) -> int:
        return self.register(iter(fleet), state=state)

    def register_inventory(self, inv: NodeInventory) -> list[HealthEvent]:
        """Keep a node agent's inventory; returns the events it implied (``Identity.register``: the
        ``moved`` events, then one per unit missing from it), ingested like any other event (stored,
        correlated, judged by the policy). NotFound for a node not registered.

        The events are ingested before the inventory is stored: if either write fails, the identity
        map goes back to what it was and the error is raised, so the agent's retry finds the moves again.
        """
        with self.lock:
            if inv.node not in self.engine.nodes:
                raise NotFound("node", inv.node)
            now = self.clock.now()
            known = self.identity.inventories(), self.identity.references()
            implied = self.identity.register(inv, now, quiet=gaps.quiet(self, inv.node))
            try:
                if implied:
                    self.ingest(implied)
                self.store.save_inventory(inv, now, self.identity.reference(inv.node))
            except Exception as err:
                log.error("%s: could not record its inventory (%s); its moves are judged again on the retry",
                          inv.node, err)
                self.identity.load(*known)
                if isinstance(err, GpufleetError):
                    raise
                raise ExternalError("database", f"recording the inventory of {inv.node}: {err}") from err
            return implied

    # ---- evidence ---------------------------------------------------------------------------
    def ingest(self, events: Sequence[HealthEvent]) -> IngestResult:
        """Accept a batch whole or reject it whole (InvalidInput names the first bad field)."""
        result = self.ingest_many([events])[0]
        if isinstance(result, GpufleetError):
            raise result
        return result

    def ingest_many(self, batches: Sequence[Sequence[HealthEvent]]) -> list[IngestResult | GpufleetError]:
        """Group commit: apply ``batches`` in order, as if one after the other, in ONE transaction.

        Each batch is still accepted whole or rejected whole: a batch that fails validation gets its
        error in its slot and the others go on; if the shared write fails, every batch is retried on
        its own, so one batch cannot sink the others. An id already stored, or sent by an earlier batch
        of the group, counts as a duplicate, exactly as it would have one request later.
        """
        with self.lock:
            out: list[IngestResult | GpufleetError] = []
            valid: list[tuple[int, Sequence[HealthEvent]]] = []
            for slot, events in enumerate(batches):
                try:
                    self._validate(events)
                except InvalidInput as err:
                    out.append(err)
                    continue
                out.append(IngestResult(0, 0, 0))
                valid.append((slot, events))
            if not valid:
                return out
            now = self.clock.now()
            if self._correlator_stale:
                self._rebuild_correlator()
            prepared = [(slot, self.admission.prepare(events)) for slot, events in valid]

            def decide(tx: IngestRound, new: set[EventKey]) -> Round | None:
                reused = _reused(prepared, new, tx)
                if reused:
                    raise _Reused(reused)
                plan, merged = Plan(), []
                for slot, events in prepared:
                    fresh = [e for e in events if (e.node, e.id) in new]
                    new.difference_update((e.node, e.id) for e in fresh)  # a later batch repeating it: duplicate
                    decided = len(plan.decisions)
                    if fresh:
                        admitted = self.admission.admit(self._on_our_clock(fresh), now)
                        merged += [(m.node, m.id, m.fault_of) for m in admitted.merged]
                        if self.correlator is not None:
                            plan.extend(self._correlate(admitted.counted, now))
                        plan.extend(self.engine.observe(admitted.to_policy, now))
                    out[slot] = IngestResult(len(fresh), len(events) - len(fresh), len(plan.decisions) - decided)
                return Round(plan, self._touched(plan), merged) if plan or merged else None

            self._begin()
            try:
                with self.store.round() as tx:
                    written = decide(tx, tx.insert_events([e for _, events in prepared for e in events], now))
                    if written is not None:
                        tx.write(written)
            except _Reused as refused:  # nothing of the round was kept: the others go again without them
                self._rollback()
                rest = [(slot, events) for slot, events in valid if slot not in refused.conflicts]
                for slot, conflict in refused.conflicts.items():
                    out[slot] = conflict
                for (slot, _), again in zip(rest, self.ingest_many([events for _, events in rest]) if rest else [],
                                            strict=True):
                    out[slot] = again
                return out
            except Exception as err:
                self._rollback()
                alone = "" if len(valid) == 1 else f", then each of its {len(valid)} batches on its own"
                self._writes.failed(err, f"; an ingest round: reloading state from the store{alone}", trace=False)
                self._reload()
                if len(valid) == 1:
                    out[valid[0][0]] = ExternalError("database", f"write failed: {brief(err)}")
                    return out
                for slot, events in valid:
                    out[slot] = self.ingest_many([events])[0]
                return out
            self._commit()
            self._writes.ok()
            self._flush_namings()
            if written is not None:
                self._notify(written.plan)
            return out

    def _validate(self, events: Sequence[HealthEvent]) -> None:
        """Unknown nodes first, then ids repeated within the batch (the first such field is named)."""
        now = self.clock.now()
        for i, e in enumerate(events):
            if e.node not in self.engine.nodes:
                raise InvalidInput(f"events[{i}].node", e.node, "a registered node (POST /v1/nodes)")
            # A time more than a day ahead of ours (or the node's measured clock lead plus the allowed skew)
            # is a broken clock or producer: stored, it would sit atop every newest-first list until that date.
            # Generous on purpose: a refused event is dropped by its agent, and a node whose clock runs some
            # minutes fast, before its first heartbeat measured it, must not lose its faults.
            lead = timedelta(seconds=max(0.0, self.clock_skew.get(e.node, 0.0)))
            ahead = max(_EVENT_AHEAD, self.max_clock_skew + lead)
            if e.time > now + ahead:
                raise InvalidInput(f"events[{i}].time", e.time.isoformat(),
                                   f"a time no later than the controller's clock ({now.isoformat(timespec='seconds')})"
                                   f" plus {ahead} (a day, or limits.max_clock_skew and the node's measured clock "
                                   "lead)")
        topo = self.topology
        if topo is not None:  # a node reports its own parts and links, never another node's (api.md §Security)
            for i, e in enumerate(events):
                ln = topo.links.get(e.link) if e.link else None
                ours = ln is not None and (self._inside(ln.a, e.node) or self._inside(ln.b, e.node))
                if ln is not None and not ours:
                    raise InvalidInput(f"events[{i}].link", e.link, f"a link with an end on node {e.node!r}")
                if e.component and e.component in topo.components and not self._inside(e.component, e.node) \
                        and not (ours and ln is not None and e.component in (ln.a, ln.b)):  # a switch's port to it
                    raise InvalidInput(f"events[{i}].component", e.component,
                                       f"a part of node {e.node!r} (the reporting node), or the far end of a link "
                                       "of it, not another node's part")
        seen: set[tuple[str, str]] = set()
        for i, e in enumerate(events):
            if (e.node, e.id) in seen:
                raise InvalidInput(f"events[{i}].id", e.id, "an id not repeated for its node within the batch")
            seen.add((e.node, e.id))

    def _inside(self, component: str, node: str) -> bool:
        """``component`` is ``node`` or one of its parts in the topology (the node named as the scheduler does)."""
        assert self.topology is not None
        return component == node or self.topology.node_of(component) == node

    def watching(self, decades: float) -> list[Watched]:
        """The correlator's watch list now (``Engine.watching``): weak patterns within ``decades`` of
        significance; empty without a topology."""
        with self.lock:
            if self.correlator is None:
                return []
            return self.correlator.watching(self.clock.now(), decades)

    def approve_held(self, nodes: Sequence[str], actor_id: str) -> Plan:
        with self.lock, self._atomic():
            plan = self.engine.approve_held(nodes, actor_id, self.clock.now())
            self._persist(plan)
            return plan

    def _correlate(self, events: Sequence[HealthEvent], now: datetime) -> Plan:
        assert self.correlator is not None
        plan = Plan()
        for e in events:
            for v in self.correlator.observe_health_event(e):
                s = v.suspect
                self.verdicts = _standing(self.verdicts, v)
                if v.status == VerdictStatus.CLEARED:
                    continue
                if s.repeats and v.status == VerdictStatus.NEW:
                    log.warning("correlation: %s", s.reason)
                    plan.audit.append(AuditEntry(now, Actor.POLICY, f"correlate:{s.component}", "repeat_offender",
                                                 s.component, s.reason))
                if s.action in _NO_DRAIN or (len(s.affected_nodes) < 2 and s.finding not in _BEYOND_EVENTS
                                             and not s.repeats):
                    continue  # one node's own fault: the per-node policy handles it
                fault = ComponentFault(s.component, s.kind, s.affected_nodes, s.reason or s.action.value,
                                       tuple(str(r) for r in s.evidence))
                log.warning("correlation: %s %s is the likely cause (confidence %.2f); %d node(s) behind it",
                            s.kind, s.component, s.confidence, len(s.affected_nodes))
                plan.extend(self.engine.observe_component_fault(fault, now))
        return plan

    def heartbeat(self, node: str, time: datetime, version: str = "") -> None:
        err = self.heartbeats([Heartbeat(node, time, version)])[0]
        if err is not None:
            raise err

    def heartbeats(self, beats: Sequence[Heartbeat]) -> list[GpufleetError | None]:
        """Record many agents' heartbeats in one transaction; None in a slot means recorded.

        A node is alive when the controller hears from it: ``last_heartbeat`` is the controller's own
        receive time, never the agent's clock (an agent an hour behind would look silent at once; one in
        2099 would never look silent). The agent's clock is measured against ours (:attr:`clock_skew`)."""
        with self.lock:
            out: list[GpufleetError | None] = [
                None if b.node in self.engine.nodes else NotFound("node", b.node) for b in beats]
            known = [b for b, err in zip(beats, out, strict=True) if err is None]
            if not known:
                return out
            now = self.clock.now()
            for b in known:
                skew = (b.time - now).total_seconds()
                if abs(skew) > self.max_clock_skew.total_seconds() >= abs(self.clock_skew.get(b.node, 0.0)):
                    log.warning("%s: agent clock is %+.0f s off the controller's; liveness uses the controller's "
                                "receive time (check NTP on the node)", b.node, skew)
                self.clock_skew[b.node] = skew
                if abs(skew) >= SKEW_CORRECTED_S:
                    self._skewed[b.node] = timedelta(seconds=skew)
                else:
                    self._skewed.pop(b.node, None)
            try:
                self.store.record_heartbeats([(b.node, now, b.version) for b in known])
            except Exception as err:
                failed = ExternalError("database", f"recording heartbeats: {brief(err)}")
                return [failed if e is None else e for e in out]
            for b in known:
                if b.node in self.engine.held:
                    self._heard_again(b.node, now)
            return out

    def _heard_again(self, node: str, now: datetime) -> None:
        """The node's agent is heard again: a held decision that was only about its silence (all of its
        evidence ``heartbeat_lost`` events) is cancelled, the node back in service; a held decision for
        anything else (a fault, a correlated group's) is left to people. Best effort: a failed write is
        logged and tried again at the next heartbeat."""
        d = self.engine.held[node]
        if d.id in self._not_silence:
            return
        try:
            kinds = self.store.event_kinds(node, d.evidence)
        except Exception as err:  # the heartbeats are recorded: their answer stands; asked again at the next
            log.warning("%s: the agent is heard again, but its held decision %s could not be read (%s); "
                        "trying again at the next heartbeat", node, d.id, brief(err))
            return
        if kinds != {EventKind.HEARTBEAT_LOST.value}:
            self._not_silence.add(d.id)
            return
        reason = f"the agent was heard again at {now.isoformat()}: the decision was only about its silence"
        try:
            with self._atomic():
                self._persist(self.engine.cancel_held(node, "controller", reason, now, actor=Actor.SYSTEM))
        except GpufleetError as err:
            log.warning("%s: %s, but cancelling its held decision %s failed (%s); trying again at the next "
                        "heartbeat", node, reason, d.id, err)
            return
        log.info("%s: held decision %s cancelled: %s", node, d.id, reason)

    def largest_clock_skew(self) -> float:
        """The largest |agent clock - controller clock| in seconds at the agents' last heartbeats (0 before
        any): ``/v1/status``'s ``max_clock_skew_s`` and the ``gpufleet_agent_clock_skew_max_seconds`` gauge."""
        with self.lock:
            return max(map(abs, self.clock_skew.values()), default=0.0)

    def audit(self, target: str, action: str, detail: str, actor_id: str = "reconciler") -> None:
        """Record a system observation (e.g. scheduler drift) in the audit log."""
        entry = AuditEntry(self.clock.now(), Actor.SYSTEM, actor_id, action, target, detail)
        with self.lock:
            self._persist(Plan(audit=[entry]))

    def checkpoint(self, job_id: str, time: datetime) -> None:
        """Record a job's checkpoint. One dated in the future beyond ``max_clock_skew`` is refused: it
        would satisfy every later "drain after the next checkpoint" without a checkpoint written."""
        if not job_id:
            raise InvalidInput("job_id", job_id, "a non-empty job id")
        now = self.clock.now()
        if time > now + self.max_clock_skew:
            raise InvalidInput("time", time.isoformat(), f"a time no later than the controller's clock "
                               f"({now.isoformat()}) plus {self.max_clock_skew}")
        self.store.add_checkpoint(job_id, time, now)

    def repair_succeeded(self, node: str, step: str, level: str, key: str) -> Plan:
        """An executor's repair step worked: repair -> revalidate (no-op when no longer in repair)."""
        with self.lock:
            plan = self.engine.repair_succeeded(node, step, level, key, self.clock.now())
            self._persist(plan)
            return plan

    def maintenance_drain(self, node: str, rollout: str, actor_id: str) -> Plan:
        """Take a serving node out for a maintenance rollout (``LifecycleEngine.maintenance_drain``)."""
        with self.lock, self._atomic():
            self.under_maintenance.add(node)
            plan = self.engine.maintenance_drain(node, rollout, actor_id, self.clock.now())
            self._persist(plan)
            return plan

    def maintenance_work(self, node: str, what: str, actor_id: str) -> Plan:
        """drained -> repair while a maintenance action runs (``LifecycleEngine.maintenance_work``)."""
        with self.lock, self._atomic():
            plan = self.engine.maintenance_work(node, what, actor_id, self.clock.now())
            self._persist(plan)
            return plan

    # ---- operators --------------------------------------------------------------------------
    def operate(self, node: str, op: OperatorOp, actor_id: str, reason: str = "") -> Plan:
        with self.lock, self._atomic():
            plan = self.engine.operator(node, op, actor_id, reason, self.clock.now())
            self._persist(plan)
            return plan

    def reset_breaker(self, actor_id: str, *, discard_held: bool = False) -> Plan:
        with self.lock, self._atomic():
            plan = self.engine.reset_breaker(actor_id, self.clock.now(), discard_held=discard_held)
            self._persist(plan)
            return plan

    def cancel_held(self, node: str, actor_id: str, reason: str = "") -> Plan:
        with self.lock, self._atomic():
            plan = self.engine.cancel_held(node, actor_id, reason or "cancelled by operator", self.clock.now())
            self._persist(plan)
            return plan

    def set_dry_run(self, on: bool, actor_id: str) -> Plan:
        with self.lock, self._atomic():
            plan = self.engine.set_dry_run(on, actor_id, self.clock.now())
            self._persist(plan)
            return plan

    # ---- time and the scheduler -------------------------------------------------------------
    def _on_our_clock(self, events: list[HealthEvent]) -> list[HealthEvent]:
        """``events`` as the policy and correlation judge them: each stamped on the controller's clock,
        its agent's time less that node's skew measured at its last heartbeat (:attr:`clock_skew`). The
        store keeps what the agent reported. Without this a node whose clock is an hour behind had every
        new fault judged older than its last transition: stale, never acted on. A fault that really is old
        (a spool that held it, a replayed log) stays old on either clock."""
        skewed = self._skewed
        if not skewed:
            return events
        return [e if e.node not in skewed else replace(e, time=e.time - skewed[e.node]) for e in events]

    def tick(self) -> Plan:
        """Time-driven work: auto-repair, auto-burn-in, link events whose correlation hold ended, and
        heartbeat-loss detection."""
        with self.lock:
            now = self.clock.now()
            with self._atomic():
                plan = self.engine.tick(now, frozenset(self.under_maintenance))
                released = self.admission.release(now, self._covered)
                if released:
                    plan.extend(self.engine.observe(released, now))
                if plan:
                    self._persist(plan)
            short = gaps.short_revalidations(self, now)
            lost = self._silent_nodes(now) + short
            if lost:
                self.ingest(lost)
            for node in {e.node for e in short}:  # told (after the ingest: a failed write tells again)
                self.gaps_told[node] = now
            return plan

    def sync(self, observed: dict[str, SchedObservation]) -> Plan:
        with self.lock, self._atomic():
            plan = self.engine.sync(observed, self.clock.now())
            self._persist(plan)
            return plan

    def action_finished(self, action_id: str, action: PlannedAction, decision: str, *, result: str) -> None:
        with self.lock, self._atomic():
            now = self.clock.now()
            plan = self.engine.action_done(action, decision, now)
            touched = [self.engine.nodes[action.node]] if action.node in self.engine.nodes else []
            try:
                self.store.update_action(action_id, status="done", now=now, result=result, plan=plan, nodes=touched)
            except GpufleetError:
                raise
            except Exception as err:
                self._reload()
                raise ExternalError("database", f"recording action {action_id}: {brief(err)}") from err
            self._notify(plan)

    # ---- leadership -------------------------------------------------------------------------
    def rebuild(self) -> None:
        """A replica that has just been elected leader: its memory becomes what the store holds (what the
        last leader committed, up to its last fenced write), exactly as at a start. Raises if the store
        cannot be read (the replica does not lead until it can)."""
        with self.lock:
            identity = Identity(self.topology)
            identity.load(self.store.load_inventories(), self.store.load_references())
            self.identity = identity
            admission = self._admission()
            engine = self._load(admission)
            self.admission, self.engine = admission, engine
            self.clock_skew.clear()
            self._skewed.clear()
            self._correlator_stale = True
            self._rebuild_correlator()
        heap.settle("rebuilding state for a new leader epoch")

    # ---- views ------------------------------------------------------------------------------
    @property
    def breaker(self) -> BreakerState:
        return self.engine.breaker

    @property
    def dry_run(self) -> bool:
        return self.engine.dry_run

    def pairing_partners(self, node: str, count: int, idle: Set[str]) -> tuple[str, ...]:
        """Known-good partners for a pairing validation of ``node`` (``LifecycleEngine.pairing_partners``)."""
        with self.lock:
            return self.engine.pairing_partners(node, count, idle)

    def states(self) -> dict[str, NodeState]:
        """Every registered node's lifecycle state (a copy)."""
        with self.lock:
            return {name: rec.state for name, rec in self.engine.nodes.items()}

    def state_of(self, node: str) -> NodeState:
        with self.lock:
            rec = self.engine.nodes.get(node)
            if rec is None:
                raise NotFound("node", node)
            return rec.state

    # ---- internals --------------------------------------------------------------------------
    def _persist(
        self,
        plan: Plan,
        *,
        events: Sequence[HealthEvent] = (),
        received: datetime | None = None,
        new_nodes: Sequence[tuple[NodeRecord, str, datetime]] = (),
    ) -> None:
        try:
            self.store.commit(plan, nodes=self._touched(plan), events=events, received=received, new_nodes=new_nodes)
        except Exception as err:
            self._writes.failed(err, "; a plan: reloading state from the store", trace=False)
            self._reload()
            raise ExternalError("database", f"write failed: {brief(err)}") from err
        self._writes.ok()
        self._notify(plan)

    def _touched(self, plan: Plan) -> list[NodeRecord]:
        """The engine's records of every node ``plan`` changes (their rows are rewritten with it)."""
        touched = {t.node for t in plan.transitions} | {a.action.node for a in plan.actions}
        return [self.engine.nodes[n] for n in sorted(touched) if n in self.engine.nodes]

    def _notify(self, plan: Plan) -> None:
        if plan:
            for cb in self.on_plan:
                cb(plan)

    @contextmanager
    def _atomic(self) -> Iterator[None]:
        """All or nothing in memory: whatever the block changes in the engine and the admission is
        undone if it raises (a failed write, a refused operation), without reading the database."""
        self._begin()
        try:
            yield
        except BaseException:
            self._rollback()
            raise
        self._commit()

    def _begin(self) -> None:
        self.engine.begin()
        self.admission.begin()

    def _commit(self) -> None:
        self.engine.commit()
        self.admission.commit()

    def _rollback(self) -> None:
        self.namings.discard()  # what this round's verdicts named: its window is replayed on the rebuild
        self.engine.rollback()
        self.admission.rollback()

    def _reload(self) -> bool:
        """After a failed write: memory becomes what the database holds — if it can be read (a commit
        whose outcome is unknown may have landed). If not, memory is left as it is (rolled back by
        :meth:`_atomic`), never half replaced."""
        # The correlation engine cannot be rolled back (it folds events into running scores): it is
        # rebuilt from the store, now or — if the store cannot be read either — before the next ingest,
        # so an event whose write failed is never counted twice when its agent sends it again.
        self._correlator_stale = True
        try:
            admission = self._admission()
            engine = self._load(admission)
        except Exception as err:
            self._writes.failed(err, "; reloading state after a failed write: memory stays as it was before it",
                                trace=False)
            return False
        self.admission, self.engine = admission, engine
        self._rebuild_correlator()
        heap.settle("reloading state after a failed write")
        return True

    def _flush_namings(self) -> None:
        try:
            self.namings.flush()
        except Exception as err:  # kept in memory; the next round writes them
            log.error("could not record repeat-offender history (%s); retrying with the next round", brief(err))

    def _rebuild_correlator(self) -> None:
        """A correlation engine holding the window's events as the store has them, and the verdicts
        standing at its end. Replaying decides nothing: what those verdicts drained is already in the
        lifecycle engine's state. On a store error the old engine stays and is rebuilt next time."""
        if self.topology is None:
            self._correlator_stale = False
            return
        correlator = Engine(self.topology, catalog=self.policy_file.catalog, history=self.namings,
                            false_alarm_budget=self.policy_file.config.correlation_false_alarm_budget)
        verdicts: list[Suspect] = []
        now = self.clock.now()
        try:
            self.namings.load(now - REPEAT_WINDOW)
            start = now - correlator.window
            # Which unit sits where outlives the window: the moves of the last week come first.
            moves = [e for e in self.store.events_since(now - correlator.inventory.memory, kinds={"moved"})
                     if e.time < start]
            window = self.store.events_since(start)
            oldest = self.store.oldest_event_time() if correlator.background_window else None
        except Exception as err:
            log.error("could not read the correlation window from the store (%s); rebuilding it later", brief(err))
            return
        # The background the coherence statistic had learned before the window, as background only:
        # without it the replay would start cold and judge weak patterns against too quiet a fleet. From
        # where the store reaches, if that is later (a controller running for less than that long).
        primed = 0
        if oldest is not None and oldest < start:
            since = max(start - correlator.background_window, oldest)
            try:
                before = self.store.events_between(since, start)
                primed = correlator.prime(self.admission.prepare_each(before, stored=True), since)
            except SQLAlchemyError as err:  # only the store's: a bug in judging or priming is not hidden
                log.error("could not read the correlation background from the store (%s); rebuilding it later",
                          brief(err))
                return
        for e in [*moves, *self.admission.prepare(window, stored=True)]:
            for v in correlator.observe_health_event(e):
                verdicts = _standing(verdicts, v)
        # Namings the replay recomputed but the store lacks (a flush lost to a crash) stay pending and are
        # written after the next committed ingest round: a replica that only follows never writes them.
        self.correlator, self.verdicts, self._correlator_stale = correlator, verdicts, False
        if window or primed:
            log.info("correlation: rebuilt the %s window from %d stored events (background primed with %d before "
                     "it), %d verdict(s) standing", correlator.window, len(window), primed, len(verdicts))

    def _load(self, admission: Admission) -> LifecycleEngine:
        cfg, catalog = self.policy_file.config, self.policy_file.catalog
        policy = Policy(cfg, catalog)
        breaker, dry_run = self.store.load_settings()
        records = [rec for rec, _rack in self.store.load_nodes()]
        engine = LifecycleEngine(policy, records, breaker=breaker, held=self.store.load_held(), dry_run=dry_run,
                                 superseded=self.store.load_held(DecisionStatus.SUPERSEDED))
        now = self.clock.now()
        engine.remember(self.store.events_since(now - policy.lookback(), kinds=policy.counted_kinds()), now)
        recent = max(2 * cfg.merge_window, cfg.correlation_hold)
        admission.remember(admission.prepare(self.store.events_since(now - recent), stored=True), now)
        return engine

    def _admission(self) -> Admission:
        cfg = self.policy_file.config
        return Admission(self.policy_file.catalog, self.topology, merge_window=cfg.merge_window,
                         hold=cfg.correlation_hold, resolve=self.identity.resolve)

    def _covered(self, e: HealthEvent) -> bool:
        """Whether a standing verdict on a shared part (a switch behind ``e``'s link, or the link
        itself, with two or more nodes behind it) already decided for ``e``'s node."""
        if self.correlator is None or not e.link:
            return False
        parts = {e.link, self.admission.shared_end(e.link)}
        return any(s.component in parts and e.node in s.affected_nodes and len(s.affected_nodes) >= 2
                   and s.action not in _NO_DRAIN for s in self.verdicts)

    def _silent_nodes(self, now: datetime) -> list[HealthEvent]:
        timeout = self.policy_file.config.heartbeat_timeout
        if not timeout:
            return []
        out = []
        for node, hb in self.store.silent_nodes(now - timeout, skip_states=("retired", "repair", "drained")):
            eid = f"heartbeat_lost:{node}:{hb.isoformat()}"
            out.append(HealthEvent(eid, node, EventKind.HEARTBEAT_LOST, now, source="controller",
                                   message=f"no heartbeat since {hb.isoformat()} (timeout {timeout})"))
        known = self.store.known_event_ids([(e.node, e.id) for e in out]) if out else set()
        return [e for e in out if (e.node, e.id) not in known]



_EVENT_AHEAD = timedelta(days=1)  # how far ahead of the controller's clock an event's time may be, at least


class _Reused(Exception):
    """Events of these batches reuse a stored (node, id) for another payload: nothing of the round is kept."""

    def __init__(self, conflicts: dict[int, Conflict]) -> None:
        super().__init__(f"{len(conflicts)} batch(es) reuse an event id")
        self.conflicts = conflicts


_PAYLOAD = ("kind", "time", "code", "severity", "message", "source", "attrs")


def _standing(verdicts: list[Suspect], v: Verdict) -> list[Suspect]:
    """The standing verdicts after ``v``: one per component, the latest; a cleared one removed."""
    kept = [x for x in verdicts if x.component != v.suspect.component]
    return kept if v.status == VerdictStatus.CLEARED else [*kept, v.suspect]


def _payload(e: HealthEvent) -> tuple[object, ...]:
    """What makes a resend the same event. ``component`` and ``link`` are left out: the controller
    renames them with topology ids, and an inventory registered since may rename them differently."""
    return (e.kind, e.time, e.code, e.severity, e.message, e.source, tuple(sorted(e.attrs)))


def _reused(prepared: Sequence[tuple[int, Sequence[HealthEvent]]], new: set[EventKey],
            tx: IngestRound) -> dict[int, Conflict]:
    """The batches (by slot) that reuse an event id of their node for another payload: one stored before,
    or one an earlier batch of the same round sent."""
    first: dict[EventKey, HealthEvent] = {}
    stored: list[EventKey] = []
    for _, events in prepared:
        for e in events:
            key = (e.node, e.id)
            if key not in new and key not in first:
                stored.append(key)
            first.setdefault(key, e)
    before = tx.stored_events(stored) if stored else {}
    out: dict[int, Conflict] = {}
    seen: set[EventKey] = set()
    for slot, events in prepared:
        for i, e in enumerate(events):
            key = (e.node, e.id)
            other = before.get(key) or (first[key] if key in seen else None)
            seen.add(key)
            if other is None or other is e or _payload(other) == _payload(e):
                continue
            field = next(f for f, a, b in zip(_PAYLOAD, _payload(other), _payload(e), strict=True) if a != b)
            out[slot] = Conflict(f"events[{i}].id: {e.id!r} of node {e.node!r} names another event already "
                                 f"(its {field} differs); an event id is an idempotency key: use a new id "
                                 "for a new event")
            break
    return out
