"""The controller's Prometheus series (``GET /metrics``; docs/metrics.md lists every one).

Two kinds of series, one registry per controller (no global state, so tests and the demo can run
several controllers in one process):

- **state**, read when scraped (a custom collector, like the agent's exporter): nodes by state, held
  decisions, the breaker, dry-run, the ingest queue, the agents' largest clock skew, merged
  observations, standing correlation suspects, the scheduler's reachability. Nothing is kept twice:
  the collector reads the engine's and the committer's own numbers under the controller's lock.
- **happenings**, counted as they happen through the observer hooks the controller and the reconciler
  already offer (``Controller.on_plan``, ``Reconciler.on_pass`` / ``on_action``): decisions by rule and
  status, transitions, breaker trips, actions by kind and outcome, reconciler pass time, the time from
  a drain decision to the scheduler confirming the drain, and the ingest requests' latency and answers
  (counted by the API's middleware in ``controller.api.metrics``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpufleet import __version__
from gpufleet.goodput.rollup import Goodput, JobInterval
from gpufleet.lifecycle.decisions import ActionKind, DecisionStatus
from gpufleet.lifecycle.plan import OutboxAction, Plan
from gpufleet.lifecycle.states import NodeState

if TYPE_CHECKING:
    from gpufleet.controller.ha.elector import Leadership
    from gpufleet.controller.ingest import GroupCommitter
    from gpufleet.controller.reconciler import Reconciler
    from gpufleet.controller.retention import Retention
    from gpufleet.controller.service import Controller

PREFIX = "gpufleet_"
# Detect-to-drain: a fatal fault on an idle node drains within a reconciler pass or two; one that waits
# for a checkpoint can take the policy's checkpoint_wait_timeout (30 min by default) or more.
DRAIN_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200)
PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
INGEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_DRAINS = frozenset({ActionKind.DRAIN, ActionKind.DRAIN_AFTER_CHECKPOINT})
MAX_GOODPUT_JOBS = 20  # per-job goodput gauges: the jobs that reported most recently (bounded cardinality)


class ControllerMetrics:
    """Every controller series, in its own registry. ``attach`` hooks it to the running parts."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.decisions = Counter(f"{PREFIX}decisions", "Decisions made, by the rule that fired and their status "
                                 "(applied, held by the breaker, dry_run).", ["rule", "status"], registry=r)
        self.decision_changes = Counter(f"{PREFIX}decision_status_changes", "Later changes of a decision's "
                                        "status (a held one approved -> applied, or cancelled).", ["status"],
                                        registry=r)
        self.transitions = Counter(f"{PREFIX}node_transitions", "Node lifecycle transitions.",
                                   ["from_state", "to_state"], registry=r)
        self.stale_events = Counter(f"{PREFIX}stale_events", "Degraded or fatal events not acted on because "
                                    "they were stamped before their node's last transition (audit: "
                                    "stale_evidence).", registry=r)
        self.events_deleted = Counter(f"{PREFIX}events_deleted", "Events deleted by retention ([retention] "
                                      "events).", registry=r)
        self.events_archived = Counter(f"{PREFIX}events_archived", "Events written to the retention archive "
                                       "before they were deleted.", registry=r)
        self.breaker_trips = Counter(f"{PREFIX}breaker_trips", "Times the blast-radius breaker tripped.", registry=r)
        self.actions = Counter(f"{PREFIX}actions", "Outbox actions the reconciler attempted, by kind and outcome "
                               "(done, waiting, retry, failed).", ["kind", "outcome"], registry=r)
        self.passes = Histogram(f"{PREFIX}reconciler_pass_seconds", "Time one reconciler pass took.",
                                buckets=PASS_BUCKETS, registry=r)
        self.detect_to_drain = Histogram(
            f"{PREFIX}detect_to_drain_seconds",
            "From the decision that takes a node out (the controller judged the evidence) to the scheduler "
            "confirming its drain.", buckets=DRAIN_BUCKETS, registry=r)
        self.ingest_seconds = Histogram(f"{PREFIX}ingest_request_seconds", "Agents' report requests, from "
                                        "arrival to answer (after the events are durable).", ["route"],
                                        buckets=INGEST_BUCKETS, registry=r)
        self.ingest_requests = Counter(f"{PREFIX}ingest_requests", "Agents' report requests by route and HTTP "
                                       "status (4xx/5xx are refusals).", ["route", "code"], registry=r)
        self.goodput_seconds = Counter(
            f"{PREFIX}goodput_seconds", "Rank-seconds of training jobs' reported goodput intervals, by category "
            "(productive or a badput category), counted when received.", ["category"], registry=r)
        self.goodput_flops = Counter(f"{PREFIX}goodput_model_flops", "Model FLOPs of the steps in reported "
                                     "intervals (all ranks), for cluster MFU.", registry=r)
        self.goodput_peak_flops = Counter(f"{PREFIX}goodput_peak_flops", "Peak FLOPs the same steps could have "
                                          "done (step time x peak FLOP/s x ranks): MFU = rate(model) / rate(peak).",
                                          registry=r)
        self.goodput_jobs: OrderedDict[str, tuple[float | None, float | None]] = OrderedDict()  # job -> ettr, mfu
        self.committer: GroupCommitter | None = None
        self.reconciler: Reconciler | None = None
        # requests refused before or by the API, by reason (the API's RefusedCounts: limits, auth)
        self.refused: Mapping[str, int] = {}
        self.leadership: Leadership | None = None  # this replica's part in leader election (None: the only one)
        self.forwards: Mapping[str, int] = {}  # a follower's requests passed on to the leader, by outcome
        r.register(_StateCollector(self))

    # ---- wiring -----------------------------------------------------------------------------
    def attach(self, committer: GroupCommitter | None = None, reconciler: Reconciler | None = None,
               retention: Retention | None = None) -> None:
        self.controller.on_plan.append(self.on_plan)
        if retention is not None:
            retention.on_run.append(self.on_retention)
        self.committer = committer
        if reconciler is not None:
            self.reconciler = reconciler
            reconciler.on_pass.append(self.on_pass)
            reconciler.on_action.append(self.on_action)

    def on_retention(self, deleted: int, archived: int) -> None:
        self.events_deleted.inc(deleted)
        self.events_archived.inc(archived)

    def on_plan(self, plan: Plan) -> None:
        if plan.stale_events:
            self.stale_events.inc(plan.stale_events)
        for d in plan.decisions:
            self.decisions.labels(d.rule, d.status.value).inc()
        for _id, status in plan.status_changes:
            self.decision_changes.labels(DecisionStatus(status).value).inc()
        for t in plan.transitions:
            self.transitions.labels(t.from_state.value, t.to_state.value).inc()
        if plan.breaker is not None and plan.breaker.tripped:
            # A plan carries the breaker only when it changed; a tripped one means it tripped now.
            self.breaker_trips.inc()

    def on_pass(self, seconds: float, attempted: int) -> None:
        self.passes.observe(seconds)

    def on_action(self, row: OutboxAction, outcome: str, now: datetime) -> None:
        self.actions.labels(row.action.kind.value, outcome).inc()
        if outcome == "done" and row.action.kind in _DRAINS:
            self.detect_to_drain.observe(max(0.0, (now - row.created).total_seconds()))

    def on_goodput(self, job: str, accepted: Sequence[JobInterval], total: Goodput | None) -> None:
        """A job reported goodput: count the new intervals, keep the job's totals for its gauges."""
        for i in accepted:
            self.goodput_seconds.labels("productive").inc(i.productive * i.world)
            for k, v in i.badput.as_dict().items():
                if v:
                    self.goodput_seconds.labels(k).inc(v * i.world)
            if i.flops is not None and i.peak_flops:
                self.goodput_flops.inc(i.flops * i.world)
                self.goodput_peak_flops.inc(i.step_s * i.peak_flops * i.world)
        if total is not None:
            with self.controller.lock:
                self.goodput_jobs[job] = (total.ettr, total.mfu)
                self.goodput_jobs.move_to_end(job)
                while len(self.goodput_jobs) > MAX_GOODPUT_JOBS:
                    self.goodput_jobs.popitem(last=False)

    def observe_ingest(self, route: str, code: int, seconds: float) -> None:
        self.ingest_requests.labels(route, str(code)).inc()
        self.ingest_seconds.labels(route).observe(seconds)


class _StateCollector:
    """Series read from the controller's state when scraped."""

    def __init__(self, metrics: ControllerMetrics) -> None:
        self.m = metrics

    def describe(self) -> list[Metric]:
        return []  # names are only known when collected; nothing to check them against ahead of time

    def collect(self) -> Iterator[Metric]:
        yield from self._leader()
        yield self._refused()  # this replica's own refusals, a follower's too (its limits, tokens, admission)
        info = GaugeMetricFamily(f"{PREFIX}controller_info", "The controller's version (always 1).",
                                 labels=["version"])
        info.add_metric([__version__], 1)
        yield info  # every replica's: a rolling upgrade shows which runs what
        lead = self.m.leadership
        if lead is not None and not lead.leading():
            return  # a follower's memory is not the fleet's state: the leader reports it (one fact, one place)
        c = self.m.controller
        with c.lock:
            states = dict.fromkeys((s.value for s in NodeState), 0)
            for rec in c.engine.nodes.values():
                states[rec.state.value] += 1
            held = len(c.engine.held)
            groups = len({d.actor_id for d in c.engine.held.values()})
            breaker = c.breaker
            dry_run = c.dry_run
            merges = c.admission.merges
            suspects: dict[tuple[str, str], int] = {}
            for s in c.verdicts:
                key = (s.kind, s.action.value)
                suspects[key] = suspects.get(key, 0) + 1
            goodput_jobs = list(self.m.goodput_jobs.items())
            skew = c.largest_clock_skew()
        nodes = GaugeMetricFamily(f"{PREFIX}nodes", "Nodes by lifecycle state.", labels=["state"])
        for state, n in states.items():
            nodes.add_metric([state], n)
        yield nodes
        yield GaugeMetricFamily(f"{PREFIX}held_decisions", "Decisions the breaker holds for an operator.",
                                value=held)
        yield GaugeMetricFamily(f"{PREFIX}held_groups", "Distinct holders of held decisions (a correlated "
                                "component holds all its nodes as one group).", value=groups)
        yield GaugeMetricFamily(f"{PREFIX}breaker_tripped", "1 while the blast-radius breaker is tripped.",
                                value=int(breaker.tripped))
        since = breaker.since.timestamp() if breaker.tripped and breaker.since is not None else 0
        yield GaugeMetricFamily(f"{PREFIX}breaker_tripped_since_timestamp_seconds",
                                "When the breaker tripped (0 while it is not).", value=since)
        yield GaugeMetricFamily(f"{PREFIX}dry_run", "1 while the controller only records decisions.",
                                value=int(dry_run))
        yield CounterMetricFamily(f"{PREFIX}observations_merged", "Observations merged onto an earlier one of "
                                  "the same fault from another source (since start).", value=merges)
        verdicts = GaugeMetricFamily(f"{PREFIX}correlation_suspects", "Standing correlation verdicts by the "
                                     "blamed component's kind and the action they call for.",
                                     labels=["kind", "action"])
        for (kind, action), n in sorted(suspects.items()):
            verdicts.add_metric([kind, action], n)
        yield verdicts
        yield GaugeMetricFamily(f"{PREFIX}agent_clock_skew_max_seconds", "The largest |agent clock - controller "
                                "clock| at the agents' last heartbeats (0 before any; liveness uses the "
                                "controller's receive time, this is for NTP alerts).", value=skew)
        yield from self._ingest()
        ettr = GaugeMetricFamily(f"{PREFIX}goodput_job_ettr", "A job's ETTR over everything it reported (the "
                                 f"{MAX_GOODPUT_JOBS} jobs that reported most recently since the controller "
                                 "started).", labels=["job"])
        mfu = GaugeMetricFamily(f"{PREFIX}goodput_job_mfu", "A job's MFU in steps over everything it reported "
                                "(jobs that declared their model FLOPs; the same jobs as goodput_job_ettr).",
                                labels=["job"])
        for job, (e, m) in goodput_jobs:
            if e is not None:
                ettr.add_metric([job], e)
            if m is not None:
                mfu.add_metric([job], m)
        yield ettr
        yield mfu
        recon = self.m.reconciler
        if recon is not None:
            yield GaugeMetricFamily(f"{PREFIX}scheduler_reachable", "1 when the last scheduler read worked.",
                                    value=int(recon.scheduler_ok))

    def _leader(self) -> Iterator[Metric]:
        lead = self.m.leadership
        leading = lead is None or lead.leading()
        yield GaugeMetricFamily(f"{PREFIX}leader", "1 while this replica leads (runs the reconciler and decides); "
                                "0 on a follower. Always 1 with one replica (SQLite).", value=int(leading))
        epoch = lead.epoch if lead is not None and lead.epoch is not None and leading else 0
        yield GaugeMetricFamily(f"{PREFIX}leader_epoch", "The lease epoch this replica leads with (the fencing "
                                "token; 0 on a follower and with one replica).", value=epoch)
        fenced = lead.fence.refused if lead is not None and lead.fence is not None else 0
        yield CounterMetricFamily(f"{PREFIX}fenced_writes", "Writes refused because this replica's lease epoch "
                                  "was not the lease's (a deposed leader's late writes).", value=fenced)
        forwards = CounterMetricFamily(f"{PREFIX}forwarded_requests", "Requests this replica passed on to the "
                                       "leader, by outcome: forwarded (the leader answered), tls_refused, "
                                       "leader_unreachable, no_leader, leader_changing.", labels=["outcome"])
        for outcome, n in sorted(self.m.forwards.items()):
            forwards.add_metric([outcome], n)
        yield forwards

    def _refused(self) -> Metric:
        com = self.m.committer
        refused = CounterMetricFamily(f"{PREFIX}requests_refused", "Requests refused by the limits, the token "
                                      "check or the full ingest queue, by reason (body_too_large, read_timeout, "
                                      "header_timeout, header_too_large, inflight, unauthenticated, forbidden, "
                                      "overloaded).",
                                      labels=["reason"])
        full = {"overloaded": com.refused} if com is not None else {}
        for reason, n in sorted((dict(self.m.refused) | full).items()):
            refused.add_metric([reason], n)
        return refused

    def _ingest(self) -> Iterator[Metric]:
        com = self.m.committer
        if com is None:
            return
        yield GaugeMetricFamily(f"{PREFIX}ingest_queue_depth", "Reports (event batches and heartbeats) waiting "
                                "for the ingest writer.", value=com.depth)
        events = CounterMetricFamily(f"{PREFIX}ingest_events", "Events received, by outcome (accepted, "
                                     "duplicate).", labels=["outcome"])
        events.add_metric(["accepted"], com.events_accepted)
        events.add_metric(["duplicate"], com.events_duplicate)
        yield events
        yield CounterMetricFamily(f"{PREFIX}ingest_batches_refused", "Event batches refused whole (invalid, "
                                  "or the write failed).", value=com.batches_refused)
        yield CounterMetricFamily(f"{PREFIX}ingest_rounds", "Group-commit transactions written.", value=com.rounds)
