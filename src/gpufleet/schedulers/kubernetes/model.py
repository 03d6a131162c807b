"""How gpufleet reads Kubernetes objects: node views, GPU pods and the jobs they belong to.

Pure functions over the official client's typed models (``V1Node``, ``V1Pod``); no API calls here.

Ownership marks gpufleet writes on a node (and only reads elsewhere):

* taint ``gpufleet.io/drain`` (effect ``NoSchedule``, value: the decision id), removed by ``resume``;
* annotation ``gpufleet.io/cordoned: "true"`` — gpufleet set ``spec.unschedulable``; without it a
  cordon is someone else's (``kubectl cordon``, another controller) and gpufleet never uncordons it;
* annotation ``gpufleet.io/drain-reason`` — the full ``gpufleet:<decision> <text>`` reason;
* condition ``GpufleetHealthy`` in ``status.conditions`` (node-problem-detector's convention:
  ``True`` is healthy, ``False`` carries a reason and message).

A *job* is the workload that owns GPU pods: a JobSet, LeaderWorkerSet, PyTorchJob (Kubeflow) or Job,
found from the labels those controllers put on their pods and the pod's controller owner reference.
A GPU pod without any of these is its own job (kind ``Pod``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from kubernetes.client import V1Node, V1ObjectMeta, V1Pod

from gpufleet.schedulers.port import REASON_PREFIX, Job, JobState, SchedNode, SchedNodeState

DOMAIN = "gpufleet.io"
TAINT_KEY = f"{DOMAIN}/drain"
SUSPECT_TAINT_KEY = f"{DOMAIN}/suspect"  # effect PreferNoSchedule: Scheduler.place_last
ANN_CORDONED = f"{DOMAIN}/cordoned"
ANN_REASON = f"{DOMAIN}/drain-reason"
ANN_SIGNAL = f"{DOMAIN}/signal"
ANN_CHECKPOINT = f"{DOMAIN}/last-checkpoint"
# A job opts in to checkpoint requests by naming the signal it handles (decision 0011), e.g. USR1.
ANN_CHECKPOINT_SIGNAL = f"{DOMAIN}/checkpoint-signal"
CONDITION_HEALTHY = "GpufleetHealthy"
GPU_RESOURCES: tuple[str, ...] = ("nvidia.com/gpu",)
# The node lifecycle controller adds this taint to every cordoned node; it is not anyone's reason.
_CORDON_TAINT = "node.kubernetes.io/unschedulable"

# Workload controllers and the pod label naming their object, most specific first.
WORKLOAD_LABELS: tuple[tuple[str, str], ...] = (
    ("JobSet", "jobset.sigs.k8s.io/jobset-name"),
    ("LeaderWorkerSet", "leaderworkerset.sigs.k8s.io/name"),
    ("PyTorchJob", "training.kubeflow.org/job-name"),
    ("Job", "batch.kubernetes.io/job-name"),
)
JOBSET_RESTARTS = "jobset.sigs.k8s.io/restart-attempt"
_TERMINAL = ("Succeeded", "Failed")


def meta(obj: V1Node | V1Pod) -> V1ObjectMeta:
    return obj.metadata or V1ObjectMeta()


def node_of(pod: V1Pod) -> str:
    """The node a pod is bound to ("" while unbound)."""
    return (pod.spec.node_name if pod.spec else None) or ""


def taint_value(reason: str) -> str:
    """The taint's value: the decision id from ``gpufleet:<decision> ...``, as a label value
    (at most 63 characters of ``[A-Za-z0-9._-]``, starting and ending alphanumeric)."""
    decision = reason.removeprefix(REASON_PREFIX).split(" ", 1)[0]
    value = re.sub(r"[^A-Za-z0-9._-]", "-", decision)[:63].strip("-._")
    return value or "drained"


def is_gpu_pod(pod: V1Pod, resources: Sequence[str] = GPU_RESOURCES) -> bool:
    containers = [*(pod.spec.containers or []), *(pod.spec.init_containers or [])] if pod.spec else []
    for c in containers:
        res = c.resources
        if res is None:
            continue
        for amounts in (res.requests or {}, res.limits or {}):
            if any(_positive(amounts.get(r)) for r in resources):
                return True
    return False


def _positive(quantity: object) -> bool:
    try:
        return quantity is not None and float(str(quantity)) > 0
    except ValueError:
        return False


def is_active(pod: V1Pod) -> bool:
    """A pod that holds (or will hold) its node: bound and not finished."""
    return bool(pod.spec and pod.spec.node_name) and (pod.status is None or pod.status.phase not in _TERMINAL)


def job_key(pod: V1Pod) -> tuple[str, str, str]:
    """(namespace, kind, name) of the workload the pod belongs to."""
    m = meta(pod)
    ns, labels = m.namespace or "default", m.labels or {}
    for kind, label in WORKLOAD_LABELS:
        if labels.get(label):
            return ns, kind, labels[label]
    for ref in m.owner_references or []:
        if ref.controller:
            return ns, ref.kind, ref.name
    return ns, "Pod", m.name or ""


def job_id(key: tuple[str, str, str]) -> str:
    return "/".join(key)


def parse_job_id(value: str) -> tuple[str, str, str] | None:
    parts = value.split("/")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 and all(parts) else None


@dataclass(frozen=True, slots=True)
class NodeMarks:
    """What gpufleet reads off a node."""

    name: str
    cordoned: bool
    cordoned_by_us: bool
    our_taint: bool
    reason: str  # ours (annotation) or, for a foreign cordon, who/what we can see
    ready: bool
    placed_last: bool = False  # our gpufleet.io/suspect:PreferNoSchedule taint

    @classmethod
    def of(cls, node: V1Node) -> NodeMarks:
        m, spec = meta(node), node.spec
        ann = m.annotations or {}
        taints = (spec.taints if spec else None) or []
        cordoned = bool(spec and spec.unschedulable)
        ours = cordoned and ann.get(ANN_CORDONED) == "true"
        if ours:
            reason = ann.get(ANN_REASON, f"{REASON_PREFIX}unknown drained by gpufleet")
        elif cordoned:
            foreign = [f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"
                       for t in taints if t.key not in (TAINT_KEY, _CORDON_TAINT)
                       and t.effect in ("NoSchedule", "NoExecute")]
            reason = "cordoned by someone else" + (f"; taints: {', '.join(foreign)}" if foreign else "")
        else:
            reason = ""
        conditions = (node.status.conditions if node.status else None) or []
        ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
        return cls(m.name or "", cordoned, ours, any(t.key == TAINT_KEY for t in taints), reason, ready,
                   any(t.key == SUSPECT_TAINT_KEY for t in taints))


def node_view(node: V1Node, jobs: Sequence[str]) -> SchedNode:
    marks = NodeMarks.of(node)
    if marks.cordoned:
        state = SchedNodeState.DRAINING if jobs else SchedNodeState.DRAINED
    elif not marks.ready:
        state = SchedNodeState.DOWN
    else:
        state = SchedNodeState.ALLOCATED if jobs else SchedNodeState.IDLE
    return SchedNode(name=marks.name, state=state, reason=marks.reason, jobs=tuple(jobs),
                     placed_last=marks.placed_last)


def jobs_of(pods: Iterable[V1Pod], *, restarts: dict[str, int] | None = None,
            resources: Sequence[str] = GPU_RESOURCES) -> list[Job]:
    """The jobs that own the given pods (GPU pods only), each with every node it runs on."""
    groups: dict[tuple[str, str, str], list[V1Pod]] = {}
    for pod in pods:
        if is_gpu_pod(pod, resources):
            groups.setdefault(job_key(pod), []).append(pod)
    return [_job(key, members, (restarts or {}).get(job_id(key), 0)) for key, members in sorted(groups.items())]


def _job(key: tuple[str, str, str], pods: list[V1Pod], requeued: int) -> Job:
    phases = [(p.status.phase if p.status else None) or "Pending" for p in pods]
    active = [p for p in pods if is_active(p)]
    if any(ph == "Running" for ph in phases):
        state = JobState.RUNNING
    elif any(ph == "Pending" for ph in phases):
        state = JobState.PENDING
    elif all(ph == "Succeeded" for ph in phases):
        state = JobState.COMPLETED
    else:
        state = JobState.FAILED
    starts = [p.status.start_time for p in pods if p.status and p.status.start_time]
    labels = [(meta(p).labels or {}).get(JOBSET_RESTARTS, "0") for p in pods]
    restarts = max([requeued, *(int(v) for v in labels if v.isdigit())])
    checkpoints = [_parse_time((meta(p).annotations or {}).get(ANN_CHECKPOINT)) for p in pods]
    declared = [(meta(p).annotations or {}).get(ANN_CHECKPOINT_SIGNAL, "") for p in pods]
    return Job(
        id=job_id(key), name=key[2], state=state,
        nodes=tuple(sorted({node_of(p) for p in active})),
        start_time=min(starts, default=None), restarts=restarts,
        last_checkpoint=max((c for c in checkpoints if c is not None), default=None),
        checkpoint_signal=next((d.upper().removeprefix("SIG") for d in declared if d), ""),
        extra=(("namespace", key[0]), ("kind", key[1]),
               ("pods", ",".join(sorted(meta(p).name or "" for p in pods)))),
    )


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
