"""The Kubernetes scheduler adapter: :class:`~gpufleet.schedulers.port.Scheduler` over the API server,
through the official Python client.

How the port's contract maps onto Kubernetes (marks and names: :mod:`.model`):

* **drain** = cordon (``spec.unschedulable``) + the ``gpufleet.io/drain:NoSchedule`` taint + the
  ``gpufleet.io/cordoned`` and ``gpufleet.io/drain-reason`` annotations, in one patch that carries the
  resourceVersion it read (a 409 Conflict re-reads and tries again), then the node condition
  ``GpufleetHealthy=False``. It never evicts: running work keeps running (``DRAINING``) until
  ``requeue`` or the job's end, exactly like a Slurm drain. A node someone else cordoned is left
  as it is (their cordon, their taints): ``foreign_drain``.
* **resume** removes gpufleet's taint and uncordons only a cordon gpufleet made; a foreign cordon is
  a :class:`Conflict` and is left alone.
* **requeue(job)** = evict the job's pods that sit on cordoned nodes through the Eviction subresource,
  which honours PodDisruptionBudgets. A 429 (the budget allows no disruption now) is an
  :class:`ExternalError` the reconciler retries later; a pod is never deleted behind a budget. The
  workload's controller (Job, JobSet, PyTorchJob, LeaderWorkerSet) recreates the pods elsewhere.
* **signal(job, sig)** and **request_checkpoint(job)** cannot reach a process through the API: they
  annotate the job's pods with ``gpufleet.io/signal: <SIG> <time>`` and send nothing; a training loop
  sees it through a downward-API volume (decision 0072).
* **Failures**: no answer, 5xx, 429 from API priority and fairness, 401/403 are
  :class:`ExternalError` (the last two not retryable: fix RBAC); 404 on a node is :class:`NotFound`.
* Every request passes a client-side rate limit (:class:`RateLimit`); reads come from a watch-fed
  cache when one is attached and synced (:mod:`.watch`), otherwise straight from the API server.
"""

from __future__ import annotations

import logging
import signal as _signal
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpufleet.domain.clock import Clock
from gpufleet.domain.errors import Conflict, ExternalError, InvalidInput, NotFound
from gpufleet.schedulers.kubernetes.model import (
    ANN_CHECKPOINT_SIGNAL,
    ANN_CORDONED,
    ANN_REASON,
    ANN_SIGNAL,
    CONDITION_HEALTHY,
    GPU_RESOURCES,
    SUSPECT_TAINT_KEY,
    TAINT_KEY,
    NodeMarks,
    is_active,
    is_gpu_pod,
    job_key,
    jobs_of,
    meta,
    node_of,
    node_view,
    parse_job_id,
    taint_value,
)
from gpufleet.schedulers.kubernetes.model import (
    job_id as job_name,
)
from gpufleet.schedulers.port import Job, JobState, SchedNode

log = logging.getLogger(__name__)

T = TypeVar("T")
SMP = "application/strategic-merge-patch+json"
_ACTIVE = "status.phase!=Succeeded,status.phase!=Failed"
_MAX_REASON = 1000


class _UtcClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class RateLimit:
    """A token bucket: ``qps`` requests a second on average, bursts of ``burst``."""

    def __init__(self, qps: float = 20.0, burst: int = 40, *, monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if qps <= 0 or burst < 1:
            raise InvalidInput("rate_limit", (qps, burst), "qps > 0 and burst >= 1")
        self.qps, self.burst = qps, burst
        self._tokens, self._last = float(burst), monotonic()
        self._monotonic, self._sleep = monotonic, sleep
        self._lock = threading.Lock()

    def acquire(self) -> float:
        """Take one token, waiting for it if need be; returns the seconds waited."""
        with self._lock:
            now = self._monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1
            wait = -self._tokens / self.qps if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)
        return wait


class Snapshot(Protocol):
    """Where reads come from: a synced watch cache (:class:`~.watch.ClusterCache`) implements this."""

    def ready(self) -> bool: ...

    def nodes(self) -> list[k8s.V1Node]: ...

    def pods(self) -> list[k8s.V1Pod]: ...


class KubernetesScheduler:
    """The Kubernetes implementation of the scheduler port (see the module docstring)."""

    name = "kubernetes"

    def __init__(self, api: k8s.ApiClient, *, gpu_resources: Sequence[str] = GPU_RESOURCES,
                 node_selector: str = "", conflict_retries: int = 5, rate_limit: RateLimit | None = None,
                 cache: Snapshot | None = None, clock: Clock | None = None,
                 checkpoint_signal: str = "") -> None:
        self.api = api
        self._core = k8s.CoreV1Api(api)
        self._gpu = tuple(gpu_resources)
        self._selector = node_selector
        self._retries = conflict_retries
        self._limit = rate_limit or RateLimit()
        self.cache = cache
        self._clock: Clock = clock or _UtcClock()
        self.checkpoint_signal = checkpoint_signal.upper().removeprefix("SIG")
        self._requeued: dict[str, int] = {}  # job id -> evictions this process made (restarts)

    @classmethod
    def connect(cls, *, kubeconfig: str | None = None, context: str | None = None,
                **kwargs: Any) -> KubernetesScheduler:
        """In-cluster service account when running in a pod (and no kubeconfig is given), else kubeconfig."""
        from kubernetes import config

        configuration = k8s.Configuration()
        try:
            if kubeconfig is None and context is None:
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            else:
                raise config.ConfigException("a kubeconfig was asked for")
        except config.ConfigException:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=configuration)
        return cls(k8s.ApiClient(configuration), **kwargs)

    def call(self, fn: Callable[[], T]) -> T:
        """Run one API call under the adapter's rate limit and error mapping (the GPUNode publisher's)."""
        return self._call(fn, raw_statuses=(404, 409))

    # ---- reads --------------------------------------------------------------------------------
    def list_nodes(self, *, jobs: bool = True) -> Sequence[SchedNode]:  # pods give the state: always read
        nodes, pods = self._snapshot()
        by_node = self._jobs_by_node(pods)
        return [node_view(n, by_node.get(meta(n).name or "", ())) for n in nodes]

    def node(self, name: str) -> SchedNode:
        node = self._read_node(name)
        pods = self._call(lambda: self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={name},{_ACTIVE}").items)
        return node_view(node, self._jobs_by_node(pods).get(name, ()))

    def list_jobs(self) -> Sequence[Job]:
        pods = self.cache.pods() if self._cached() and self.cache else self._call(
            lambda: self._core.list_pod_for_all_namespaces().items)
        return jobs_of(pods, restarts=self._requeued, resources=self._gpu)

    def job(self, job_id: str) -> Job:
        for j in self.list_jobs():
            if j.id == job_id:
                return j
        raise NotFound("job", job_id)

    def jobs_on(self, node: str) -> Sequence[Job]:
        self._read_node(node)  # NotFound for a node the cluster does not know
        return [j for j in self.list_jobs() if j.state == JobState.RUNNING and node in j.nodes]

    # ---- node changes -------------------------------------------------------------------------
    def drain(self, node: str, reason: str) -> bool:
        text = " ".join(reason.split())[:_MAX_REASON]
        if not text:
            raise InvalidInput("reason", reason, "a non-empty drain reason")
        patched = [False]  # whether the last read found the node to cordon (a 409 reads it again)

        def change(current: k8s.V1Node) -> dict[str, Any] | None:
            marks = NodeMarks.of(current)
            patched[0] = not marks.cordoned
            if marks.cordoned:
                if not marks.cordoned_by_us:
                    log.info("%s: already cordoned by someone else (%s); leaving it as it is", node, marks.reason)
                return None
            taints = [t for t in self._taints(current) if t.get("key") != TAINT_KEY]
            taints.append({"key": TAINT_KEY, "value": taint_value(text), "effect": "NoSchedule",
                           "timeAdded": _iso(self._clock.now())})
            return {"metadata": {"annotations": {ANN_CORDONED: "true", ANN_REASON: text}},
                    "spec": {"unschedulable": True, "taints": taints}}

        current = self._update_node(node, change)
        if NodeMarks.of(current).cordoned_by_us:
            self.set_condition(node, CONDITION_HEALTHY, False, "GpufleetDrained", text, current=current)
            log.info("%s: cordoned and tainted %s:NoSchedule: %s", node, TAINT_KEY, text)
        return patched[0]

    def resume(self, node: str) -> None:
        def change(current: k8s.V1Node) -> dict[str, Any] | None:
            marks = NodeMarks.of(current)
            if marks.cordoned and not marks.cordoned_by_us:
                raise Conflict(f"node {node} is cordoned by someone else ({marks.reason}); "
                               "gpufleet uncordons only nodes it cordoned")
            if not marks.cordoned_by_us and not marks.our_taint:
                return None
            patch: dict[str, Any] = {
                "metadata": {"annotations": {ANN_CORDONED: None, ANN_REASON: None}},
                "spec": {"taints": [t for t in self._taints(current) if t.get("key") != TAINT_KEY]},
            }
            if marks.cordoned_by_us:
                patch["spec"]["unschedulable"] = False
            return patch

        before = NodeMarks.of(self._read_node(node))
        current = self._update_node(node, change)
        if before.cordoned_by_us or before.our_taint:
            self.set_condition(node, CONDITION_HEALTHY, True, "GpufleetResumed", "returned to service by gpufleet",
                               current=current)
            log.info("%s: uncordoned; taint %s removed (was %r)", node, TAINT_KEY, before.reason)

    def place_last(self, node: str, last: bool) -> None:
        """Keep ``node`` last in placement with the ``gpufleet.io/suspect:PreferNoSchedule`` taint (the
        scheduler avoids the node while others fit; running pods stay); ``False`` removes it."""

        def change(current: k8s.V1Node) -> dict[str, Any] | None:
            if NodeMarks.of(current).placed_last == last:
                return None
            taints = [t for t in self._taints(current) if t.get("key") != SUSPECT_TAINT_KEY]
            if last:
                taints.append({"key": SUSPECT_TAINT_KEY, "effect": "PreferNoSchedule",
                               "timeAdded": _iso(self._clock.now())})
            return {"metadata": {}, "spec": {"taints": taints}}

        self._update_node(node, change)

    def set_condition(self, node: str, ctype: str, healthy: bool, reason: str, message: str, *,
                      current: k8s.V1Node | None = None) -> None:
        """Write a node condition the way node-problem-detector does (a strategic merge on
        ``status.conditions``, keyed by type). ``healthy`` is the condition's status for ``Gpufleet*``
        health conditions; the transition time moves only when the status flips."""
        current = current or self._read_node(node)
        status = "True" if healthy else "False"
        now = _iso(self._clock.now())
        existing = next((c for c in (current.status.conditions if current.status else None) or []
                         if c.type == ctype), None)
        if existing is not None and (existing.status, existing.reason, existing.message) == (status, reason, message):
            return
        changed = existing is None or existing.status != status
        since = now if changed or existing is None or existing.last_transition_time is None \
            else _iso(existing.last_transition_time)
        body = {"status": {"conditions": [{"type": ctype, "status": status, "reason": reason, "message": message,
                                           "lastHeartbeatTime": now, "lastTransitionTime": since}]}}
        self._call(lambda: self._core.patch_node_status(node, body, _content_type=SMP), node=node)

    # ---- job changes --------------------------------------------------------------------------
    def requeue(self, job_id: str) -> None:
        pods = self._job_pods(job_id)
        cordoned = {meta(n).name for n in self._nodes_now() if NodeMarks.of(n).cordoned}
        targets = [p for p in pods if is_active(p) and node_of(p) in cordoned]
        if not targets:
            log.info("job %s: no pod on a cordoned node; requeue is a no-op", job_id)
            return
        blocked: list[str] = []
        evicted = 0
        for pod in targets:
            name, ns = meta(pod).name or "", meta(pod).namespace or "default"
            try:
                self._call(partial(self._core.create_namespaced_pod_eviction, name, ns, k8s.V1Eviction(
                    api_version="policy/v1", kind="Eviction", metadata=k8s.V1ObjectMeta(name=name, namespace=ns))),
                    raw_statuses=(404, 429, 500))
                evicted += 1
            except ApiException as err:
                if err.status == 404:
                    continue  # already gone: the eviction (or the job's end) happened
                blocked.append(f"{ns}/{name}: {_message(err)}")
        if evicted:
            self._requeued[job_id] = self._requeued.get(job_id, 0) + 1
            log.info("job %s: evicted %d pod(s) from cordoned nodes", job_id, evicted)
        if blocked:
            raise ExternalError("kubernetes", f"job {job_id}: eviction refused for {'; '.join(blocked)} "
                                "(a PodDisruptionBudget allows no disruption now); will retry")

    def signal(self, job_id: str, signal: str) -> None:
        name = signal.upper().removeprefix("SIG")
        if name.isdigit() or f"SIG{name}" not in _signal.Signals.__members__:
            raise InvalidInput("signal", signal, "a signal name such as USR1, TERM or INT")
        value = f"{name} {_iso(self._clock.now())}"
        body = {"metadata": {"annotations": {ANN_SIGNAL: value}}}
        for pod in self._job_pods(job_id):
            self._call(partial(self._core.patch_namespaced_pod, meta(pod).name or "", meta(pod).namespace or "",
                               body, _content_type=SMP))
        log.info("job %s: asked for %s through the %s pod annotation", job_id, name, ANN_SIGNAL)

    def request_checkpoint(self, job_id: str) -> str:
        """Ask a running job to checkpoint: the ``gpufleet.io/signal`` annotation (see :meth:`signal`);
        nothing is sent to the process. Only a job that opted in (``gpufleet.io/checkpoint-signal`` on
        its pods) or, with a site-wide ``checkpoint_signal``, every job is asked; returns the signal
        named, "" when the job is not asked."""
        running = [p for p in self._job_pods(job_id) if is_active(p) and p.status and p.status.phase == "Running"]
        if not running:
            raise NotFound("running job", job_id)
        declared = [(meta(p).annotations or {}).get(ANN_CHECKPOINT_SIGNAL, "") for p in running]
        sig = next((d.upper().removeprefix("SIG") for d in declared if d), "") or self.checkpoint_signal
        if not sig:  # opt-in (decision 0011): the job did not name a signal and the site sets none
            return ""
        self.signal(job_id, sig)
        return sig

    # ---- internals ----------------------------------------------------------------------------
    def _cached(self) -> bool:
        return self.cache is not None and self.cache.ready()

    def _snapshot(self) -> tuple[list[k8s.V1Node], list[k8s.V1Pod]]:
        if self._cached() and self.cache is not None:
            return self.cache.nodes(), self.cache.pods()
        return self._nodes_now(), self._call(
            lambda: self._core.list_pod_for_all_namespaces(field_selector=_ACTIVE).items)

    def _nodes_now(self) -> list[k8s.V1Node]:
        return list(self._call(lambda: self._core.list_node(label_selector=self._selector or None).items))

    def _jobs_by_node(self, pods: Sequence[k8s.V1Pod]) -> dict[str, tuple[str, ...]]:
        out: dict[str, set[str]] = {}
        for pod in pods:
            if is_active(pod) and is_gpu_pod(pod, self._gpu):
                out.setdefault(node_of(pod), set()).add(job_name(job_key(pod)))
        return {k: tuple(sorted(v)) for k, v in out.items()}

    def _job_pods(self, job_id: str) -> list[k8s.V1Pod]:
        key = parse_job_id(job_id)
        if key is None:  # not namespace/Kind/name, as list_jobs reports ids: no such job here
            raise NotFound("job", job_id)
        pods = self._call(lambda: self._core.list_namespaced_pod(key[0]).items)
        mine = [p for p in pods if is_gpu_pod(p, self._gpu) and job_key(p) == key]
        if not mine and job_id not in self._requeued:
            raise NotFound("job", job_id)
        return mine

    def _read_node(self, name: str) -> k8s.V1Node:
        return self._call(lambda: self._core.read_node(name), node=name)

    @staticmethod
    def _taints(node: k8s.V1Node) -> list[dict[str, Any]]:
        taints = (node.spec.taints if node.spec else None) or []
        out: list[dict[str, Any]] = []
        for t in taints:  # as the API writes them (camelCase, no nulls)
            taint: dict[str, Any] = {"key": t.key, "effect": t.effect}
            if t.value:
                taint["value"] = t.value
            if t.time_added:
                taint["timeAdded"] = _iso(t.time_added)
            out.append(taint)
        return out

    def _update_node(self, name: str, change: Callable[[k8s.V1Node], dict[str, Any] | None]) -> k8s.V1Node:
        """Read, compute a patch, write it with the resourceVersion read; on 409 read again."""
        for attempt in range(1, self._retries + 1):
            current = self._read_node(name)
            patch = change(current)
            if patch is None:
                return current
            patch["metadata"]["resourceVersion"] = meta(current).resource_version
            try:
                return self._call(partial(self._core.patch_node, name, patch, _content_type=SMP),
                                  node=name, raw_statuses=(409,))
            except ApiException:
                log.warning("%s: the node changed while gpufleet wrote it (409, attempt %d/%d); reading it again",
                            name, attempt, self._retries)
        raise ExternalError("kubernetes", f"node {name}: {self._retries} conflicting writes in a row; will retry")

    def _call(self, fn: Callable[[], T], *, node: str | None = None, raw_statuses: tuple[int, ...] = ()) -> T:
        self._limit.acquire()
        try:
            return fn()
        except ApiException as err:
            if err.status in raw_statuses:
                raise
            if err.status == 404 and node is not None:
                raise NotFound("node", node) from None
            if err.status in (401, 403):
                raise ExternalError("kubernetes", f"{err.status} {_message(err)}: the service account lacks a "
                                    "permission (see the chart's RBAC)", retryable=False) from None
            raise ExternalError("kubernetes", f"{err.status} {_message(err)}") from None
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise ExternalError("kubernetes", f"API server unreachable: {err}") from None


def _message(err: ApiException) -> str:
    import json

    try:
        body = json.loads(err.body or "{}")
    except ValueError:
        return str(err.reason)
    causes = [c.get("message", "") for c in (body.get("details") or {}).get("causes") or []]
    return "; ".join(filter(None, [body.get("message") or str(err.reason), *causes]))


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
