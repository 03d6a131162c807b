"""The scheduler-contract harness for the Kubernetes adapter: the real adapter and the official client
over HTTP against :class:`~tests.k8s.fakeapi.FakeKubeAPI`.

The harness plays the cluster's other actors: the kubelet (a bound pod becomes Running and Ready, a
finished one Succeeded), the Job controller (a job whose pod was evicted gets a new, unbound pod) and
the operator (``kubectl cordon`` plus a taint of their own).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s

from gpufleet.schedulers.kubernetes import KubernetesScheduler
from gpufleet.schedulers.kubernetes.model import ANN_SIGNAL
from tests.k8s.fakeapi import FakeKubeAPI

NAMESPACE = "training"


def node_object(name: str, *, ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                       "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
                       "capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}}}


def gpu_pod(name: str, job: str, node: str | None, *, gpus: int = 8,
            labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NAMESPACE,
                     "labels": {"batch.kubernetes.io/job-name": job, "app": job, **(labels or {})},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job,
                                          "uid": f"uid-{job}", "controller": True}]},
        "spec": {"nodeName": node, "containers": [{"name": "trainer", "image": "trainer:1",
                                                   "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": "Pending"},
    }


def running(pod: dict[str, Any]) -> dict[str, Any]:
    pod["status"] = {"phase": "Running", "startTime": "2026-11-23T10:00:00Z",
                     "conditions": [{"type": "Ready", "status": "True"}]}
    return pod


@dataclass
class KubernetesHarness:
    api: FakeKubeAPI
    scheduler: KubernetesScheduler
    nodes: list[str]
    _jobs: dict[str, str] = field(default_factory=dict)  # job id -> job name, for jobs still wanted
    _count: int = 0

    @classmethod
    def create(cls) -> KubernetesHarness:
        api = FakeKubeAPI().start()
        nodes = ["gpu-a", "gpu-b", "gpu-c"]
        for n in nodes:
            api.put("nodes", node_object(n))
        return cls(api, KubernetesScheduler(client_for(api)), nodes)

    def close(self) -> None:
        self.scheduler.api.close()
        self.api.stop()

    def start_job(self, node: str) -> str:
        self._count += 1
        job = f"train-{self._count}"
        # The pod is created through the API, as the Job controller would; the kube-scheduler binds it
        # and the kubelet reports it running.
        core = k8s.CoreV1Api(self.scheduler.api)
        core.create_namespaced_pod(NAMESPACE, gpu_pod(f"{job}-0", job, node))
        self.api.put("pods", running(gpu_pod(f"{job}-0", job, node)))
        job_id = f"{NAMESPACE}/Job/{job}"
        self._jobs[job_id] = job
        self.eventually(lambda: job_id in [j.id for j in self.scheduler.jobs_on(node)], f"{job_id} running")
        return job_id

    def start_checkpointing_job(self, node: str) -> str:
        return self.start_job(node)  # the job reads the annotation through a downward-API volume

    def checkpoint_requested(self, job_id: str) -> bool:
        name = job_id.rsplit("/", maxsplit=1)[-1]
        return any(ANN_SIGNAL in (p["metadata"].get("annotations") or {}) for p in self.api.objects("pods")
                   if p["metadata"]["labels"].get("batch.kubernetes.io/job-name") == name)

    def end_job(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)
        for pod in self.api.objects("pods"):
            if pod["metadata"]["labels"].get("batch.kubernetes.io/job-name") == job_id.rsplit("/", maxsplit=1)[-1]:
                pod["status"] = {"phase": "Succeeded"}
                self.api.put("pods", pod)

    def foreign_drain(self, node: str, reason: str) -> None:
        core = k8s.CoreV1Api(self.scheduler.api)
        core.patch_node(node, {"spec": {"unschedulable": True}})  # kubectl cordon
        value = re.sub(r"[^A-Za-z0-9._-]+", "-", reason).strip("-._")[:63]
        taints = [*(self.api.get("nodes", node) or {}).get("spec", {}).get("taints", []),
                  {"key": "example.com/maintenance", "value": value, "effect": "NoSchedule"}]
        core.patch_node(node, {"spec": {"taints": taints}})  # kubectl taint

    def job_controller_step(self) -> None:
        """A wanted job with no pod left gets a new one (unbound: the scheduler places it later)."""
        present = {p["metadata"]["labels"].get("batch.kubernetes.io/job-name") for p in self.api.objects("pods")}
        for job in self._jobs.values():
            if job not in present:
                self._count += 1
                self.api.put("pods", gpu_pod(f"{job}-r{self._count}", job, None))

    def eventually(self, check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.job_controller_step()
            if check():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for: {what}")
            time.sleep(0.02)


def client_for(api: FakeKubeAPI) -> k8s.ApiClient:
    configuration = k8s.Configuration(host=api.url)
    configuration.retries = 0  # an unreachable server is an error at once, not after urllib3's retries
    return k8s.ApiClient(configuration)
