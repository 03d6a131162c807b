"""``GPUNode`` resources kept in step with the controller's store, and ``spec.maintenance`` as a drain,
through the real adapter against the fake API server (issue #20)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpufleet.cli.controller import gpunode_sync
from gpufleet.controller.clock import ManualClock
from gpufleet.controller.kubesync import FAULT_CLASSES, GpuNodeSync, condition_type
from gpufleet.controller.reconciler import Reconciler
from gpufleet.controller.service import Controller
from gpufleet.controller.store.db import make_engine, migrate
from gpufleet.controller.store.repo import Store
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.fleet import Node
from gpufleet.lifecycle.config import parse_policy
from gpufleet.lifecycle.decisions import ActionKind, PlannedAction
from gpufleet.lifecycle.plan import OutboxAction
from gpufleet.lifecycle.states import NodeState
from gpufleet.schedulers.kubernetes import KubernetesScheduler
from gpufleet.schedulers.kubernetes.gpunodes import resource_name
from tests.k8s.fakeapi import FakeKubeAPI
from tests.k8s.harness import client_for, node_object

pytestmark = pytest.mark.kubernetes
NODES = ["gpu-a", "gpu-b", "gpu-c"]
T0 = datetime(2026, 11, 26, 12, tzinfo=UTC)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[FakeKubeAPI, Controller, KubernetesScheduler]]:
    api = FakeKubeAPI().start()
    for n in NODES:
        api.put("nodes", node_object(n))
    sched = KubernetesScheduler(client_for(api))
    engine = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    migrate(engine)
    c = Controller(Store(engine), parse_policy({"breaker": {"max_unavailable_fleet": 1.0}}), ManualClock(T0))
    c.register([Node(n, "r01") for n in NODES], state=NodeState.READY)
    yield api, c, sched
    sched.api.close()
    api.stop()


def test_every_node_is_shown_with_its_state_and_why_and_only_changes_are_written(
        world: tuple[FakeKubeAPI, Controller, KubernetesScheduler]) -> None:
    api, c, sched = world
    sync = gpunode_sync(c, sched)
    sync.run_pass()
    shown = {o["metadata"]["name"]: o for o in api.objects("gpunodes")}
    assert set(shown) == set(NODES)
    assert {o["status"]["state"] for o in shown.values()} == {"ready"}
    assert shown["gpu-a"]["spec"] == {}
    versions = {n: o["metadata"]["resourceVersion"] for n, o in shown.items()}
    c.ingest([HealthEvent("x79", "gpu-b", EventKind.XID, T0 + timedelta(seconds=1), "gpu-b-gpu0", 79)])
    sync.run_pass()
    after = {o["metadata"]["name"]: o for o in api.objects("gpunodes")}
    assert after["gpu-b"]["status"]["state"] == c.state_of("gpu-b").value != "ready"
    assert "79" in after["gpu-b"]["status"]["reason"] and after["gpu-b"]["status"]["evidence"] == ["x79"]
    assert after["gpu-b"]["status"]["since"].endswith("Z")
    # the nodes that did not change were not written again
    assert {n: after[n]["metadata"]["resourceVersion"] for n in ("gpu-a", "gpu-c")} == {
        n: versions[n] for n in ("gpu-a", "gpu-c")}


def test_spec_maintenance_drains_the_node_once_through_gpufleet(
        world: tuple[FakeKubeAPI, Controller, KubernetesScheduler]) -> None:
    api, c, sched = world
    sync = gpunode_sync(c, sched)
    sync.run_pass()
    obj = api.get("gpunodes", "gpu-c")
    assert obj is not None
    api.put("gpunodes", {**obj, "spec": {"maintenance": True, "reason": "BIOS update CHG-1234"}})
    sync.run_pass()
    assert c.state_of("gpu-c") == NodeState.DRAINING
    audit = [a for a in c.store.audit() if a.target == "gpu-c"]
    assert any(a.actor_id == "gpunode-spec" and "BIOS update CHG-1234" in a.detail for a in audit), audit
    drains = len(c.store.decisions())
    sync.run_pass()  # the flag is still set: nothing is asked twice
    assert len(c.store.decisions()) == drains
    assert api.get("gpunodes", "gpu-c")["status"]["state"] == "draining"


def test_a_failing_api_server_is_logged_and_the_next_pass_catches_up(
        world: tuple[FakeKubeAPI, Controller, KubernetesScheduler], caplog: pytest.LogCaptureFixture) -> None:
    api, c, sched = world
    sync = gpunode_sync(c, sched)
    api.fail_next(1, 503)
    with caplog.at_level(logging.WARNING, "gpufleet.controller.kubesync"):
        sync.run_pass()  # never raises into the reconciler
    assert "not updated this pass" in caplog.text
    sync.run_pass()
    assert {o["metadata"]["name"] for o in api.objects("gpunodes")} == set(NODES)


def _drain_gpu_a_through_a_reconciler_pass(c: Controller, sched: KubernetesScheduler) -> GpuNodeSync:
    """A fatal XID on gpu-a, then one real reconciler pass with the sync wired as the CLI wires it."""
    sync = gpunode_sync(c, sched)
    reconciler = Reconciler(c, sched)
    reconciler.on_pass.append(sync.run_pass)
    reconciler.on_action.append(sync.on_action)
    c.ingest([HealthEvent("x79", "gpu-a", EventKind.XID, T0 + timedelta(seconds=1), "gpu-a-gpu0", 79)])
    reconciler.run_once()
    return sync


def test_each_action_the_reconciler_carries_out_is_a_remediation(
        world: tuple[FakeKubeAPI, Controller, KubernetesScheduler]) -> None:
    api, c, sched = world
    _drain_gpu_a_through_a_reconciler_pass(c, sched)
    (drain,) = [r for r in c.store.actions(node="gpu-a") if r.kind == "drain"]
    assert drain.status == "done"
    rems = {o["metadata"]["name"]: o for o in api.objects("remediations")}
    name = resource_name(drain.id)
    assert name in rems and ":" not in name
    rem = rems[name]
    assert rem["spec"]["node"] == "gpu-a" and rem["spec"]["action"] == "drain"
    assert rem["spec"]["decision"] == drain.decision_id
    assert rem["status"]["phase"] == "done" and rem["status"]["finishedAt"].endswith("Z")
    # the node itself is cordoned by the adapter, and its GPUNode shows the drain
    assert api.get("nodes", "gpu-a")["spec"].get("unschedulable") is True
    assert api.get("gpunodes", "gpu-a")["status"]["state"] in ("draining", "drained")


def test_a_drain_marks_its_fault_class_unhealthy_and_a_resume_clears_every_class(
        world: tuple[FakeKubeAPI, Controller, KubernetesScheduler]) -> None:
    api, c, sched = world
    sync = _drain_gpu_a_through_a_reconciler_pass(c, sched)

    def conditions() -> dict[str, tuple[str, str]]:
        return {x["type"]: (x["status"], x["reason"]) for x in api.get("nodes", "gpu-a")["status"]["conditions"]}

    got = conditions()
    assert got["GpufleetGPUHealthy"] == ("False", "GpufleetFault")  # XID 79: a GPU fault
    assert "GpufleetFabricHealthy" not in got and got["GpufleetHealthy"][0] == "False"
    (drain,) = [r for r in c.store.actions(node="gpu-a") if r.kind == "drain"]
    resume = OutboxAction(f"{drain.decision_id}:resume", drain.decision_id, PlannedAction(ActionKind.RESUME, "gpu-a"),
                          T0)
    sync.on_action(resume, "done", T0 + timedelta(minutes=5))
    after = conditions()
    assert {t: after[t][0] for t in (condition_type(k) for k in FAULT_CLASSES)} == dict.fromkeys(
        (condition_type(k) for k in FAULT_CLASSES), "True")
