"""Parsing Slurm 22.05 outputs recorded on the lab cluster."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpufleet.domain.errors import ExternalError
from gpufleet.schedulers.port import JobState, SchedNodeState
from gpufleet.schedulers.slurm.parse import jobs_from_squeue, node_from_scontrol, nodes_from_sinfo
from tests.unit.slurm.replay import recorded_job_ids, recording


def test_sinfo_busy_maps_states_and_reasons() -> None:
    nodes = {n.name: n for n in nodes_from_sinfo(recording("sinfo-busy").stdout)}
    assert nodes["n1"].state == SchedNodeState.ALLOCATED
    assert nodes["n2"].state == SchedNodeState.DRAINED
    assert nodes["n2"].reason == "gpufleet:d-42 xid 79 gpu fell off the bus"
    assert nodes["n3"].state == SchedNodeState.DRAINING  # admin drain while train-b still runs
    assert nodes["n3"].reason == "admin: replacing PSU"
    assert nodes["ghost"].state == SchedNodeState.DRAINED  # UNKNOWN+DRAIN: no slurmd, but out
    assert nodes["n1"].features == ("gpu", "h100") and nodes["n1"].weight == 10
    assert nodes["ghost"].features == () and nodes["ghost"].weight == 1
    assert nodes["n2"].reason_user == "root" and nodes["n2"].reason_time is not None


def test_views_report_ownership() -> None:
    nodes = {n.name: n.view() for n in nodes_from_sinfo(recording("sinfo-busy").stdout)}
    assert nodes["n2"].drained_by_us and not nodes["n2"].foreign_drain
    assert nodes["n3"].foreign_drain and not nodes["n3"].drained_by_us
    assert not nodes["n1"].drained_by_us and not nodes["n1"].foreign_drain
    assert nodes["n1"].reason == ""


def test_sinfo_idle_all_idle() -> None:
    nodes = {n.name: n for n in nodes_from_sinfo(recording("sinfo-idle").stdout)}
    assert [nodes[f"n{i}"].state for i in (1, 2, 3)] == [SchedNodeState.IDLE] * 3
    assert nodes["ghost"].state == SchedNodeState.UNKNOWN


@pytest.mark.parametrize("node", ["n1", "n2", "n3", "ghost"])
def test_scontrol_show_node_agrees_with_sinfo(node: str) -> None:
    """Two independent recordings of the same moment must give the same node."""
    from_sinfo = {n.name: n for n in nodes_from_sinfo(recording("sinfo-busy").stdout)}[node]
    from_scontrol = node_from_scontrol(recording(f"show-node-{node}-busy").stdout, node)
    assert from_scontrol.state == from_sinfo.state
    assert from_scontrol.reason == from_sinfo.reason
    assert from_scontrol.features == from_sinfo.features
    assert from_scontrol.weight == from_sinfo.weight
    assert from_scontrol.partitions == from_sinfo.partitions
    if from_sinfo.reason:
        assert from_scontrol.reason_user == from_sinfo.reason_user


def test_scontrol_state_with_flags() -> None:
    n3 = node_from_scontrol(recording("show-node-n3-busy").stdout, "n3")
    assert n3.base_state == "mixed" and n3.flags == ("DRAIN",)
    assert n3.slurm_state == "MIXED+DRAIN"


def test_squeue_busy_jobs() -> None:
    ids = recorded_job_ids()
    jobs = {j.id: j for j in jobs_from_squeue(recording("squeue-busy").stdout)}
    a, b = jobs[ids["train-a"]], jobs[ids["train-b"]]
    assert a.state == JobState.RUNNING and a.nodes == ("n1",)
    assert a.last_checkpoint == datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
    assert b.nodes == ("n1", "n3")  # "n[1,3]" expanded
    assert b.last_checkpoint is None
    requeued = jobs[ids["to-requeue"]]
    assert requeued.state == JobState.PENDING and requeued.restarts == 1 and requeued.nodes == ()
    assert dict(requeued.extra)["state_reason"] == "BeginTime"
    held = jobs[ids["held"]]
    assert held.state == JobState.PENDING and dict(held.extra)["state_reason"] == "JobHeldUser"
    assert jobs[ids["waits"]].start_time is None


@pytest.mark.parametrize("name", ["sinfo-unreachable", "squeue-unreachable"])
def test_unreachable_controller_in_json_is_retryable_error(name: str) -> None:
    """22.05 exits 0 with an error entry and an empty list: that must not read as "no nodes"."""
    rec = recording(name)
    assert rec.returncode == 0
    parse = nodes_from_sinfo if name.startswith("sinfo") else jobs_from_squeue
    with pytest.raises(ExternalError) as err:
        parse(rec.stdout)
    assert err.value.retryable


def test_garbage_is_external_error() -> None:
    with pytest.raises(ExternalError, match="not JSON"):
        nodes_from_sinfo("slurm_load_node error: Zero Bytes")
    with pytest.raises(ExternalError, match="no 'nodes' list"):
        nodes_from_sinfo('{"errors": []}')


def test_scontrol_unreachable_text_is_retryable() -> None:
    rec = recording("show-node-unreachable")
    with pytest.raises(ExternalError) as err:
        node_from_scontrol(rec.stderr, "n1")
    assert err.value.retryable


def test_job_gpus_from_tres_strings() -> None:
    from gpufleet.schedulers.slurm.parse import tres_gpus

    assert tres_gpus("cpu=64,mem=512G,node=8,billing=64,gres/gpu=64") == 64
    assert tres_gpus("cpu=8,gres/gpu:h100=4,gres/gpu:a100=2") == 6
    assert tres_gpus("cpu=8,gres/gpu=8,gres/gpu:h100=8") == 8  # the untyped total wins, no double count
    assert tres_gpus("cpu=1,node=1,billing=1") == 0
    assert tres_gpus("") == 0
