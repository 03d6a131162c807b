"""The Slurm adapter's decisions (what it asks Slurm to do), replaying recorded lab outputs."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpufleet.domain.errors import Conflict, ExternalError, InvalidInput, NotFound
from gpufleet.schedulers.port import SchedNodeState, Scheduler, drain_reason
from gpufleet.schedulers.slurm import SlurmScheduler, SubprocessRunner
from gpufleet.schedulers.slurm.runner import CommandResult
from tests.unit.slurm.replay import ReplayRunner, busy_cluster, recorded_job_ids, recording


def _sched(runner: ReplayRunner) -> SlurmScheduler:
    return SlurmScheduler(runner)


def test_is_a_scheduler() -> None:
    assert isinstance(_sched(busy_cluster()), Scheduler)


def test_list_nodes_joins_jobs() -> None:
    ids = recorded_job_ids()
    nodes = {n.name: n for n in _sched(busy_cluster()).list_nodes()}
    assert set(nodes["n1"].jobs) == {ids["train-a"], ids["train-b"]}
    assert nodes["n3"].jobs == (ids["train-b"],)
    assert nodes["n2"].jobs == ()


def test_drain_idle_node_sends_reason() -> None:
    r = busy_cluster()
    _sched(r).drain("n1", drain_reason("d-7", "xid 79\ngpu fell off the bus"))
    assert r.writes == [("scontrol", "update", "nodename=n1", "state=drain",
                         "reason=gpufleet:d-7 xid 79 gpu fell off the bus")]


@pytest.mark.parametrize("node", ["n2", "n3", "ghost"])
def test_drain_of_drained_node_changes_nothing(node: str) -> None:
    """n2/ghost: drained by us (idempotent); n3: drained by an admin (their reason is kept)."""
    r = busy_cluster()
    _sched(r).drain(node, drain_reason("d-8", "again"))
    assert r.writes == []


def test_resume_ours_resumes() -> None:
    r = busy_cluster()
    _sched(r).resume("n2")
    assert r.writes == [("scontrol", "update", "nodename=n2", "state=resume")]


def test_resume_foreign_drain_is_conflict_and_touches_nothing() -> None:
    r = busy_cluster()
    with pytest.raises(Conflict, match="replacing PSU"):
        _sched(r).resume("n3")
    assert r.writes == []


def test_resume_of_undrained_node_is_noop() -> None:
    r = busy_cluster()
    _sched(r).resume("n1")
    assert r.writes == []


def test_unknown_node_is_not_found() -> None:
    r = ReplayRunner({("scontrol", "show", "node", "nosuch"): "show-node-unknown"})
    with pytest.raises(NotFound) as err:
        _sched(r).drain("nosuch", drain_reason("d-1", "x"))
    assert err.value.ident == "nosuch"
    assert r.writes == []


def test_unreachable_controller_is_retryable() -> None:
    r = ReplayRunner({("scontrol", "show", "node", "n1"): "show-node-unreachable",
                      ("sinfo", "--json"): "sinfo-unreachable"})
    s = _sched(r)
    for call in (lambda: s.node("n1"), s.list_nodes, lambda: s.drain("n1", "gpufleet:d x")):
        with pytest.raises(ExternalError) as err:
            call()
        assert err.value.retryable and err.value.system == "slurm"


def test_failed_update_while_unreachable_is_retryable() -> None:
    r = busy_cluster()
    r.answer(("scontrol", "update", "nodename=n1", "state=drain", "reason=gpufleet:d-1 x"), "update-unreachable")
    with pytest.raises(ExternalError) as err:
        _sched(r).drain("n1", "gpufleet:d-1 x")
    assert err.value.retryable


def test_requeue_running_job_only() -> None:
    ids = recorded_job_ids()
    r = busy_cluster()
    s = _sched(r)
    s.requeue(ids["to-requeue"])  # already requeued, pending: a retried requeue is a no-op
    s.requeue(ids["waits"])  # pending
    assert r.writes == []
    s.requeue(ids["train-a"])
    assert r.writes == [("scontrol", "requeue", ids["train-a"])]


def test_requeue_starts_now_when_asked() -> None:
    ids = recorded_job_ids()
    r = busy_cluster()
    SlurmScheduler(r, requeue_starts_now=True).requeue(ids["train-a"])
    assert r.writes == [("scontrol", "requeue", ids["train-a"]),
                        ("scontrol", "update", f"jobid={ids['train-a']}", "starttime=now")]


def test_requeue_unknown_job_is_not_found() -> None:
    with pytest.raises(NotFound):
        _sched(busy_cluster()).requeue("999999")


def test_hold_unknown_job_is_not_found() -> None:
    r = ReplayRunner({("scontrol", "hold", "999999"): "hold-unknown"})
    with pytest.raises(NotFound):
        _sched(r).hold("999999")


def test_jobs_on_node() -> None:
    ids = recorded_job_ids()
    s = _sched(busy_cluster())
    assert {j.id for j in s.jobs_on("n1")} == {ids["train-a"], ids["train-b"]}
    assert s.jobs_on("n2") == []
    with pytest.raises(NotFound):
        s.jobs_on("nosuch")


def test_node_view_draining_with_job() -> None:
    ids = recorded_job_ids()
    view = _sched(busy_cluster()).node("n3")
    assert view.state == SchedNodeState.DRAINING and view.jobs == (ids["train-b"],)


def test_signal_validates_name() -> None:
    r = busy_cluster()
    s = _sched(r)
    s.signal("5", "sigusr1")
    assert r.writes == [("scancel", "--signal=USR1", "--full", "5")]
    with pytest.raises(InvalidInput) as err:
        s.signal("5", "BOGUS")
    assert err.value.field == "signal" and err.value.value == "BOGUS"


def test_bad_inputs_name_field_value_expectation() -> None:
    s = _sched(busy_cluster())
    with pytest.raises(InvalidInput, match="reason") as err:
        s.drain("n1", "   ")
    assert "non-empty" in err.value.expected
    with pytest.raises(InvalidInput) as err:
        s.set_weight("n1", -1)
    assert err.value.field == "weight" and err.value.value == -1
    with pytest.raises(InvalidInput) as err:
        s.set_features("n1", ["gpu", "a,b"])
    assert err.value.field == "features"


def test_partition_nodes_command_and_bad_names() -> None:
    r = busy_cluster()
    s = _sched(r)
    s.set_partition_nodes("high", ["ghost", "n1"])
    assert r.writes == [("scontrol", "update", "partitionname=high", "nodes=ghost,n1")]
    with pytest.raises(InvalidInput) as err:
        s.set_partition_nodes("high low", ["n1"])
    assert err.value.field == "partition"
    with pytest.raises(InvalidInput) as err:
        s.set_partition_nodes("high", ["n1,n2"])
    assert err.value.field == "nodes"


def test_features_and_weight_commands() -> None:
    r = busy_cluster()
    s = _sched(r)
    s.set_features("n1", ["gpu", "h100", "quarantine"])
    s.set_weight("n1", 100)
    assert r.writes == [
        ("scontrol", "update", "nodename=n1", "availablefeatures=gpu,h100,quarantine",
         "activefeatures=gpu,h100,quarantine"),
        ("scontrol", "update", "nodename=n1", "weight=100"),
    ]


def test_record_checkpoint_keeps_comment() -> None:
    ids = recorded_job_ids()
    r = busy_cluster()
    _sched(r).record_checkpoint(ids["train-a"], datetime(2026, 11, 21, 13, 5, 9, tzinfo=UTC))
    assert r.writes == [("scontrol", "update", f"jobid={ids['train-a']}",
                         "comment=run 7 gpufleet:checkpoint=2026-11-21T13:05:09Z")]


def test_subprocess_runner_missing_binary_is_not_retryable() -> None:
    with pytest.raises(ExternalError) as err:
        SubprocessRunner()(["gpufleet-no-such-binary-xyz"], timeout=5)
    assert not err.value.retryable


def test_subprocess_runner_timeout_is_retryable() -> None:
    with pytest.raises(ExternalError, match="did not answer") as err:
        SubprocessRunner()([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.3)
    assert err.value.retryable


def test_subprocess_runner_passes_slurm_conf() -> None:
    res = SubprocessRunner("/x/slurm.conf")([sys.executable, "-c", "import os; print(os.environ['SLURM_CONF'])"],
                                            timeout=10)
    assert res.returncode == 0 and res.stdout.strip() == "/x/slurm.conf"


def test_drain_lost_in_slurmctld_restart_is_reasserted() -> None:
    """n1 was drained by us, slurmctld crashed before saving it (BOOT_TIME changed, flag gone)."""
    r = busy_cluster()
    r.answer(("scontrol", "show", "config"), ["show-config", "show-config-restarted"])
    s = _sched(r)
    s.drain("n1", "gpufleet:d-5 xid 79")
    s.list_nodes()  # the recording shows n1 ALLOCATED without DRAIN
    drain = ("scontrol", "update", "nodename=n1", "state=drain", "reason=gpufleet:d-5 xid 79")
    assert r.writes == [drain, drain]


def test_drain_cleared_by_an_operator_is_respected() -> None:
    """Same picture but slurmctld did not restart: someone resumed the node on purpose."""
    r = busy_cluster()
    s = _sched(r)
    s.drain("n1", "gpufleet:d-6 xid 79")
    s.list_nodes()
    s.list_nodes()
    assert r.writes == [("scontrol", "update", "nodename=n1", "state=drain", "reason=gpufleet:d-6 xid 79")]


def test_requeue_answered_pending_execution_is_a_noop() -> None:
    """A just-requeued job still shows COMPLETING; Slurm then refuses with "pending execution"."""
    ids = recorded_job_ids()
    r = busy_cluster()
    r.answer(("scontrol", "requeue", ids["train-a"]), "requeue-pending")
    _sched(r).requeue(ids["train-a"])  # no exception
    assert r.writes == [("scontrol", "requeue", ids["train-a"])]


def test_rest_reader_needs_one_transport() -> None:
    from gpufleet.schedulers.slurm.restd import RestReader

    with pytest.raises(InvalidInput) as err:
        RestReader()
    assert err.value.field == "slurmrestd"


def test_rest_reader_unreachable_socket_is_retryable(tmp_path: Path) -> None:
    from gpufleet.schedulers.slurm.restd import RestReader

    s = SlurmScheduler(busy_cluster(), reader=RestReader(socket=str(tmp_path / "no.sock")))
    with pytest.raises(ExternalError) as err:
        s.list_nodes()
    assert err.value.retryable


def test_drain_succeeds_even_if_boot_time_unreadable() -> None:
    """slurmctld dies right after accepting the drain: the drain is done; it is not re-asserted later."""
    r = busy_cluster()
    r.answer(("scontrol", "show", "config"), "show-node-unreachable")
    s = _sched(r)
    s.drain("n1", "gpufleet:d-9 xid 79")
    s.list_nodes()
    assert r.writes == [("scontrol", "update", "nodename=n1", "state=drain", "reason=gpufleet:d-9 xid 79")]


def _with_comment(job_name: str, comment: str) -> ReplayRunner:
    """The busy recording, with ``job_name``'s comment replaced (how a job declares its signal) in both
    reads of a job: the whole queue (``squeue --json``) and the job alone (``scontrol show job``)."""
    doc = json.loads(recording("squeue-busy").stdout)
    for j in doc["jobs"]:
        if j["name"] == job_name:
            j["comment"] = comment
    job_id = recorded_job_ids()[job_name]
    shown = [line for line in recording(f"show-job-{job_name}-busy").stdout.splitlines()
             if not line.strip().startswith("Comment=")]
    shown.insert(1, f"   Comment={comment} ")
    r = busy_cluster()
    squeue = r._answers.pop(("squeue", "--json"))
    assert squeue == "squeue-busy"

    class Runner(ReplayRunner):
        def __call__(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
            if tuple(argv) == ("squeue", "--json"):
                self.calls.append(tuple(argv))
                return CommandResult(tuple(argv), 0, json.dumps(doc), "")
            if tuple(argv) == ("scontrol", "show", "job", job_id):
                self.calls.append(tuple(argv))
                return CommandResult(tuple(argv), 0, "\n".join(shown) + "\n", "")
            return super().__call__(argv, timeout=timeout)

    return Runner(r._answers)


def test_checkpoint_request_uses_the_signal_the_job_declared() -> None:
    ids = recorded_job_ids()
    r = _with_comment("train-b", "llama gpufleet:signal=USR2")
    s = SlurmScheduler(r)
    assert s.job(ids["train-b"]).checkpoint_signal == "USR2"
    assert s.request_checkpoint(ids["train-b"]) == "USR2"
    assert r.writes == [("scancel", "--signal=USR2", "--full", ids["train-b"])]


def test_a_job_that_declared_no_signal_is_not_signalled_unless_the_site_says_so() -> None:
    ids = recorded_job_ids()
    r = busy_cluster()
    assert SlurmScheduler(r).request_checkpoint(ids["train-a"]) == ""  # no token, no site default
    assert r.writes == []
    r2 = busy_cluster()
    assert SlurmScheduler(r2, checkpoint_signal="SIGTERM", checkpoint_target="batch").request_checkpoint(
        ids["train-a"]) == "TERM"
    assert r2.writes == [("scancel", "--signal=TERM", "--batch", ids["train-a"])]


def test_every_pass_reads_only_the_running_jobs_not_the_whole_queue() -> None:
    """squeue --json (22.05) ignores --states and prints every queued job; the node view needs only
    the running ones, which squeue's text form filters. Same answer as the full record says."""
    r = busy_cluster()
    nodes = {n.name: set(n.jobs) for n in _sched(r).list_nodes()}
    assert ("squeue", "--json") not in r.calls
    from gpufleet.schedulers.slurm.parse import jobs_from_squeue

    expected: dict[str, set[str]] = {}
    for j in jobs_from_squeue(recording("squeue-busy").stdout):  # the full record of the same moment
        if j.state.value == "running":
            for n in j.nodes:
                expected.setdefault(n, set()).add(j.id)
    assert {n: ids for n, ids in nodes.items() if ids} == expected


def test_the_reconcilers_pass_reads_the_nodes_only_and_their_states_say_which_are_busy() -> None:
    """``list_nodes(jobs=False)`` (every reconciler pass) is ``sinfo --json`` alone: no squeue at all,
    whose cost in slurmctld follows the queue. Same states as the full read; a node with jobs shows
    busy (ALLOCATED / DRAINING) without their ids."""
    r = busy_cluster()
    bare = {n.name: n for n in _sched(r).list_nodes(jobs=False)}
    assert [c[0] for c in r.calls] == ["sinfo"]
    full = {n.name: n for n in _sched(busy_cluster()).list_nodes()}
    assert {k: v.state for k, v in bare.items()} == {k: v.state for k, v in full.items()}
    assert all(not n.jobs for n in bare.values())
    busy = {SchedNodeState.ALLOCATED, SchedNodeState.DRAINING}
    assert {k for k, v in bare.items() if v.state in busy} == {k for k, v in full.items() if v.jobs}


def test_an_unreachable_controller_while_reading_running_jobs_is_a_retryable_error() -> None:
    from tests.unit.slurm.replay import RUNNING

    r = busy_cluster()
    r.answer(RUNNING, "running-unreachable")
    with pytest.raises(ExternalError) as err:
        _sched(r).list_nodes()
    assert err.value.retryable


@pytest.mark.parametrize("text", ["n1|1\n", "12\n", "abc|n1\n"])
def test_unexpected_squeue_text_is_an_error_naming_the_line(text: str) -> None:
    from gpufleet.schedulers.slurm.parse import running_from_squeue_text

    with pytest.raises(ExternalError) as err:
        running_from_squeue_text(text)
    assert text.strip() in str(err.value)
