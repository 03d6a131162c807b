"""The Kubernetes adapter beyond the scheduler contract: budgets, conflicts, other people's marks,
conditions, failures, jobs of several kinds, signals, the watch cache."""

from __future__ import annotations

import pytest

from gpufleet.domain.errors import ExternalError, InvalidInput, NotFound
from gpufleet.schedulers.kubernetes.model import ANN_SIGNAL, CONDITION_HEALTHY, TAINT_KEY
from gpufleet.schedulers.kubernetes.watch import ClusterCache
from gpufleet.schedulers.port import SchedNodeState, drain_reason
from tests.k8s.harness import NAMESPACE, KubernetesHarness, client_for, gpu_pod, node_object, running

pytestmark = pytest.mark.kubernetes


def condition(kube: KubernetesHarness, node: str, ctype: str) -> dict[str, str] | None:
    conds = (kube.api.get("nodes", node) or {}).get("status", {}).get("conditions", [])
    return next((c for c in conds if c["type"] == ctype), None)


def test_requeue_behind_a_budget_is_retried_later_and_never_deletes(kube: KubernetesHarness) -> None:
    s, node = kube.scheduler, kube.nodes[0]
    job = kube.start_job(node)
    kube.api.put("poddisruptionbudgets", {"metadata": {"name": "train", "namespace": NAMESPACE},
                                          "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train-1"}}}})
    s.drain(node, drain_reason("d-1", "xid 79"))
    with pytest.raises(ExternalError, match="disruption budget") as err:
        s.requeue(job)
    assert err.value.retryable
    assert job in [j.id for j in s.jobs_on(node)], "the pod behind the budget is still there"
    assert ("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/train-1-0") not in kube.api.requests
    kube.api.put("poddisruptionbudgets", {"metadata": {"name": "train", "namespace": NAMESPACE},
                                          "spec": {"minAvailable": 0, "selector": {"matchLabels": {"app": "train-1"}}}})
    s.requeue(job)  # the retry, once the budget allows it
    kube.eventually(lambda: s.node(node).state == SchedNodeState.DRAINED, "drained and empty")


def test_a_write_racing_another_writer_is_retried_and_keeps_their_change(kube: KubernetesHarness) -> None:
    s, node = kube.scheduler, kube.nodes[1]

    def other_controller() -> None:
        current = kube.api.get("nodes", node) or {}
        current["metadata"].setdefault("labels", {})["topology.example.com/rack"] = "r7"
        kube.api.put("nodes", current)

    kube.api.before_next_write(other_controller)
    s.drain(node, drain_reason("d-2", "row remap failure"))
    stored = kube.api.get("nodes", node) or {}
    assert stored["spec"]["unschedulable"] is True
    assert stored["metadata"]["labels"]["topology.example.com/rack"] == "r7"
    patches = [r for r in kube.api.requests if r == ("PATCH", f"/api/v1/nodes/{node}")]
    assert len(patches) == 2, "the first patch met a 409 and was sent again after a fresh read"


def test_drain_and_resume_keep_other_taints_and_touch_only_ours(kube: KubernetesHarness) -> None:
    s, node = kube.scheduler, kube.nodes[2]
    obj = kube.api.get("nodes", node) or {}
    obj["spec"]["taints"] = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    kube.api.put("nodes", obj)
    s.drain(node, drain_reason("d-3", "nvlink errors"))
    taints = (kube.api.get("nodes", node) or {})["spec"]["taints"]
    assert {t["key"] for t in taints} == {"nvidia.com/gpu", TAINT_KEY}
    ours = next(t for t in taints if t["key"] == TAINT_KEY)
    assert (ours["value"], ours["effect"]) == ("d-3", "NoSchedule")
    s.resume(node)
    after = kube.api.get("nodes", node) or {}
    assert [t["key"] for t in after["spec"]["taints"]] == ["nvidia.com/gpu"]
    assert not after["spec"]["unschedulable"]
    assert not any(k.startswith("gpufleet.io/") for k in after["metadata"].get("annotations", {}))


def test_drain_writes_the_health_condition_next_to_the_kubelets(kube: KubernetesHarness) -> None:
    s, node = kube.scheduler, kube.nodes[0]
    s.drain(node, drain_reason("d-4", "xid 48 double-bit ECC"))
    cond = condition(kube, node, CONDITION_HEALTHY)
    assert cond is not None and cond["status"] == "False" and "xid 48" in cond["message"]
    assert condition(kube, node, "Ready") is not None, "the kubelet's conditions stay"
    s.resume(node)
    cond = condition(kube, node, CONDITION_HEALTHY)
    assert cond is not None and cond["status"] == "True"


def test_a_taint_alone_is_not_a_drain_and_resume_clears_a_leftover_taint(kube: KubernetesHarness) -> None:
    s, node = kube.scheduler, kube.nodes[1]
    obj = kube.api.get("nodes", node) or {}
    obj["spec"]["taints"] = [{"key": TAINT_KEY, "value": "d-9", "effect": "NoSchedule"}]  # a half-done resume
    kube.api.put("nodes", obj)
    assert s.node(node).state == SchedNodeState.IDLE
    s.resume(node)
    assert not (kube.api.get("nodes", node) or {})["spec"].get("taints")


def test_unreachable_or_failing_api_is_a_retryable_external_error(kube: KubernetesHarness) -> None:
    s = kube.scheduler
    kube.api.fail_next(1, 503)
    with pytest.raises(ExternalError) as err:
        s.list_nodes()
    assert err.value.retryable
    kube.api.fail_next(1, 403, "Forbidden")
    with pytest.raises(ExternalError) as err:
        s.drain(kube.nodes[0], drain_reason("d-5", "x"))
    assert not err.value.retryable and "RBAC" in str(err.value)
    kube.api.stop()
    with pytest.raises(ExternalError, match="unreachable"):
        s.node(kube.nodes[0])


def test_unknown_job_and_malformed_job_id(kube: KubernetesHarness) -> None:
    with pytest.raises(NotFound):
        kube.scheduler.requeue(f"{NAMESPACE}/Job/nope")
    with pytest.raises(NotFound):
        kube.scheduler.requeue("nope")


def test_pods_of_one_jobset_on_two_nodes_are_one_job_and_cpu_pods_are_not_jobs(kube: KubernetesHarness) -> None:
    labels = {"jobset.sigs.k8s.io/jobset-name": "llama", "jobset.sigs.k8s.io/restart-attempt": "2"}
    kube.api.put("pods", running(gpu_pod("llama-0", "llama-w", kube.nodes[0], labels=labels)))
    kube.api.put("pods", running(gpu_pod("llama-1", "llama-w", kube.nodes[1], labels=labels)))
    cpu = running(gpu_pod("logger", "logger", kube.nodes[2]))
    cpu["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    kube.api.put("pods", cpu)
    jobs = {j.id: j for j in kube.scheduler.list_jobs()}
    assert set(jobs) == {f"{NAMESPACE}/JobSet/llama"}
    assert jobs[f"{NAMESPACE}/JobSet/llama"].nodes == (kube.nodes[0], kube.nodes[1])
    assert jobs[f"{NAMESPACE}/JobSet/llama"].restarts == 2
    assert kube.scheduler.node(kube.nodes[2]).state == SchedNodeState.IDLE


def test_signal_annotates_the_jobs_pods(kube: KubernetesHarness) -> None:
    job = kube.start_job(kube.nodes[0])
    kube.scheduler.signal(job, "sigusr1")
    pod = kube.api.get("pods", "train-1-0", NAMESPACE) or {}
    assert pod["metadata"]["annotations"][ANN_SIGNAL].startswith("USR1 ")
    with pytest.raises(InvalidInput):
        kube.scheduler.signal(job, "NOPE")


def test_down_node_shows_down(kube: KubernetesHarness) -> None:
    kube.api.put("nodes", node_object("gpu-z", ready=False))
    assert kube.scheduler.node("gpu-z").state == SchedNodeState.DOWN


def test_watch_cache_follows_changes_and_relists_after_410(kube: KubernetesHarness) -> None:
    kube.api.bookmark_interval = 0.1
    cache = ClusterCache(client_for(kube.api), watch_timeout=1, retry_wait=0.05).start()
    try:
        kube.scheduler.cache = cache
        kube.eventually(cache.ready, "cache synced")
        kube.api.put("nodes", node_object("gpu-new"))
        kube.eventually(lambda: "gpu-new" in [n.name for n in kube.scheduler.list_nodes()], "watch saw the node")
        # a bookmark moves the cache's resourceVersion past changes to other resources
        kube.api.put("pods", running(gpu_pod("p", "p", "gpu-new")))
        head = int((kube.api.get("pods", "p", NAMESPACE) or {})["metadata"]["resourceVersion"])
        kube.eventually(lambda: int(cache.resource_version("nodes")) >= head, "bookmark advanced the node watch")
    finally:
        cache.stop()


def test_watch_cache_resuming_from_a_compacted_version_gets_410_and_lists_again(kube: KubernetesHarness) -> None:
    from kubernetes.client.exceptions import ApiException

    cache = ClusterCache(client_for(kube.api), watch_timeout=1, retry_wait=0.05)
    nodes = cache._resources[0]
    cache._list(nodes)
    kube.api.put("nodes", node_object("gpu-late"))
    kube.api.compact()  # the history the cache would resume from is gone
    with pytest.raises(ApiException) as err:
        cache._watch(nodes, 1)
    assert err.value.status == 410
    cache.start()
    try:
        kube.eventually(lambda: "gpu-late" in [n.metadata.name for n in cache.nodes() if n.metadata], "relisted")
        assert cache.relists()["nodes"] >= 2
    finally:
        cache.stop()
