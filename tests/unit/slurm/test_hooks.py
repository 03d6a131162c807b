"""Hook logic with a recording drainer and real check subprocesses (no Slurm needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpufleet.agent.nodestatus import write_status
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.nodestatus import NodeStatus, parse_status
from gpufleet.schedulers.slurm.hooks import epilog, healthcheck, prolog
from gpufleet.schedulers.slurm.runner import SubprocessRunner

NOW = datetime(2026, 11, 21, 13, 0, tzinfo=UTC)


class Drains:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def drain(self, node: str, reason: str) -> bool:
        """As the port: True when this call drained the node, False when it already was drained."""
        drained = node not in {n for n, _ in self.calls}
        self.calls.append((node, reason))
        return drained


def _run(argv: list[str] | tuple[str, ...], timeout: float):  # type: ignore[no-untyped-def]
    return SubprocessRunner()(argv, timeout=timeout)


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_prolog_passes_on_exit_0() -> None:
    d = Drains()
    out = prolog("n1", "7", _py("pass"), _run, d)
    assert out.ok and not out.drained and d.calls == []


def test_prolog_refuses_with_checks_reason_from_json() -> None:
    report = {"format": "gpufleet.check/v1", "status": "fail", "results": [
        {"check": "gemm_bf16", "gpu": 3, "status": "fail", "message": "412 TFLOP/s < 600 expected",
         "value": 412, "unit": "TFLOP/s", "expected": 600},
        {"check": "hbm", "gpu": 3, "status": "pass", "message": "", "value": 3, "unit": "TB/s", "expected": 2.8},
    ]}
    code = f"import json,sys; print(json.dumps({report!r})); sys.exit(1)"
    d = Drains()
    out = prolog("n2", "41", _py(code), _run, d)
    assert not out.ok and out.drained
    assert d.calls == [("n2", "gpufleet:prolog-41 quick check failed: gemm_bf16 gpu3: 412 TFLOP/s < 600 expected")]
    assert "hbm" not in d.calls[0][1]


def test_prolog_refuses_with_last_stderr_line() -> None:
    d = Drains()
    out = prolog("n2", "42", _py("import sys; print('warming up', file=sys.stderr); "
                                 "print('nvlink: 2 links down', file=sys.stderr); sys.exit(1)"), _run, d)
    assert not out.ok
    assert d.calls == [("n2", "gpufleet:prolog-42 quick check failed: nvlink: 2 links down")]


def test_prolog_timeout_counts_as_failure() -> None:
    d = Drains()
    out = prolog("n3", "5", _py("import time; time.sleep(30)"), _run, d, timeout=0.5)
    assert not out.ok
    assert d.calls and "timed out after 0.5 s" in d.calls[0][1]


def test_prolog_fails_open_when_check_cannot_run() -> None:
    d = Drains()
    out = prolog("n1", "5", ["/nonexistent/gpufleet-check"], _run, d)
    assert out.ok and "WARNING" in out.message and d.calls == []
    out = prolog("n1", "5", _py("import sys; print('No such command check', file=sys.stderr); sys.exit(2)"), _run, d)
    assert out.ok and "exited 2" in out.message and d.calls == []


def test_prolog_fail_closed_refuses_when_check_cannot_run() -> None:
    d = Drains()
    out = prolog("n1", "5", ["/nonexistent/gpufleet-check"], _run, d, fail_closed=True)
    assert not out.ok and "could not run" in d.calls[0][1]


def test_prolog_needs_a_node() -> None:
    with pytest.raises(InvalidInput) as err:
        prolog("", "5", _py("pass"), _run, Drains())
    assert err.value.field == "node"


def test_epilog_appends_journal_lines(tmp_path: Path) -> None:
    journal = tmp_path / "sub" / "jobs.jsonl"
    env = {"SLURM_JOB_ID": "12", "SLURM_JOB_USER": "alice", "SLURM_JOB_EXIT_CODE": "0", "HOME": "/root"}
    epilog("n1", env, journal, NOW)
    epilog("n1", {**env, "SLURM_JOB_ID": "13"}, journal, NOW + timedelta(seconds=5))
    lines = [json.loads(x) for x in journal.read_text().splitlines()]
    assert [x["job_id"] for x in lines] == ["12", "13"]
    assert lines[0]["format"] == "gpufleet.slurm-job/v1" and lines[0]["job_user"] == "alice"
    assert "home" not in lines[0]


def test_epilog_never_fails(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = epilog("n1", {}, blocker / "jobs.jsonl", NOW)  # parent is a file: cannot write
    assert out.ok and "WARNING" in out.message


def _status(tmp_path: Path, worst: str, *, node: str = "n1", age: timedelta = timedelta(seconds=3),
             reasons: tuple[str, ...] = ("xid 79 on gpu5: GPU has fallen off the bus",)) -> Path:
    path = tmp_path / "node-status.json"
    write_status(path, NodeStatus(node, NOW - age, worst, reasons, decision="d-abc"))
    return path


def test_healthcheck_drains_on_fatal(tmp_path: Path) -> None:
    d = Drains()
    out = healthcheck("n1", _status(tmp_path, "fatal"), d, NOW, timedelta(minutes=5))
    assert not out.ok and out.drained
    assert d.calls == [("n1", "gpufleet:d-abc xid 79 on gpu5: GPU has fallen off the bus")]


def test_healthcheck_on_a_node_already_drained_says_nothing_and_exits_0(tmp_path: Path) -> None:
    d = Drains()
    first = healthcheck("n1", _status(tmp_path, "fatal"), d, NOW, timedelta(minutes=5))
    again = healthcheck("n1", _status(tmp_path, "fatal"), d, NOW, timedelta(minutes=5))
    assert (first.ok, first.drained, bool(first.message)) == (False, True, True)
    assert (again.ok, again.drained, again.message) == (True, False, "")


@pytest.mark.parametrize("worst", ["ok", "info", "degraded"])
def test_healthcheck_leaves_non_fatal_alone(tmp_path: Path, worst: str) -> None:
    d = Drains()
    assert healthcheck("n1", _status(tmp_path, worst), d, NOW, timedelta(minutes=5)).ok
    assert d.calls == []


def test_healthcheck_ignores_stale_missing_or_foreign_status(tmp_path: Path) -> None:
    d = Drains()
    stale = healthcheck("n1", _status(tmp_path, "fatal", age=timedelta(minutes=10)), d, NOW, timedelta(minutes=5))
    assert stale.ok and "old" in stale.message
    other = healthcheck("n1", _status(tmp_path, "fatal", node="n9"), d, NOW, timedelta(minutes=5))
    assert other.ok and "n9" in other.message
    missing = healthcheck("n1", tmp_path / "none.json", d, NOW, timedelta(minutes=5))
    assert missing.ok and "no agent status" in missing.message
    assert d.calls == []


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"format": "other/v1"}, "s.format"),
        ({"format": "gpufleet.node-status/v1", "node": "", "worst": "ok", "time": "2026-11-21T12:00:00Z"}, "s.node"),
        ({"format": "gpufleet.node-status/v1", "node": "n1", "worst": "bad", "time": "2026-11-21T12:00:00Z"},
         "s.worst"),
        ({"format": "gpufleet.node-status/v1", "node": "n1", "worst": "ok", "time": "2026-11-21T12:00:00"}, "s.time"),
        ({"format": "gpufleet.node-status/v1", "node": "n1", "worst": "ok", "time": "2026-11-21T12:00:00Z",
          "reasons": "x"}, "s.reasons"),
    ],
)
def test_bad_status_names_the_field(doc: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_status(json.dumps(doc), "s")
    assert err.value.field == field


def test_status_round_trip(tmp_path: Path) -> None:
    path = _status(tmp_path, "degraded", reasons=("ecc sbe rising", "thermal 88C"))
    st = parse_status(path.read_text())
    assert st == NodeStatus("n1", NOW - timedelta(seconds=3), "degraded", ("ecc sbe rising", "thermal 88C"), "d-abc")


def _gpufleet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("gpufleet")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": "/usr/bin:/bin", **(env or {})})


def test_cli_usage_errors_name_the_option() -> None:
    res = _gpufleet("slurm", "prolog")
    assert res.returncode == 2 and "--node" in res.stderr
    res = _gpufleet("slurm", "checkpoint")
    assert res.returncode == 2 and "--job-id" in res.stderr
    res = _gpufleet("slurm", "checkpoint", "--job-id", "5", "--at", "noon", "--no-comment")
    assert res.returncode == 2 and "--at" in res.stderr and "ISO-8601" in res.stderr


def test_cli_epilog_writes_journal(tmp_path: Path) -> None:
    journal = tmp_path / "j.jsonl"
    res = _gpufleet("slurm", "epilog", "--journal", str(journal), env={"SLURMD_NODENAME": "n4", "SLURM_JOB_ID": "9"})
    assert res.returncode == 0, res.stderr
    assert json.loads(journal.read_text())["node"] == "n4"


def test_healthcheck_leaves_a_fatal_status_to_a_controller_the_agent_reached_lately(tmp_path: Path) -> None:
    """A drill on the Slurm lab: the hook drained three nodes the controller held (its budget full), and
    drained a node again under its own validation job. A fatal status the agent delivered within
    ``controller_fresh`` is the controller's to act on; past it (or with 0s, or unstated) the hook drains."""
    path = tmp_path / "node-status.json"
    reasons = ("xid 79 on gpu5: GPU has fallen off the bus",)
    for reached, fresh, drained in (
        (NOW - timedelta(seconds=20), timedelta(minutes=2), False),
        (NOW - timedelta(minutes=3), timedelta(minutes=2), True),  # the controller out of reach for 3 minutes
        (NOW - timedelta(seconds=20), timedelta(0), True),  # --controller-fresh 0s: always drain
        (None, timedelta(minutes=2), True),  # a status that does not say (a site script's)
    ):
        d = Drains()  # an undrained node each time
        write_status(path, NodeStatus("n1", NOW - timedelta(seconds=3), "fatal", reasons, controller_reached=reached))
        before = len(d.calls)
        out = healthcheck("n1", path, d, NOW, timedelta(minutes=5), controller_fresh=fresh)
        assert (len(d.calls) > before, out.drained, out.ok) == (drained, drained, not drained), (reached, fresh)
        if not drained:
            assert "left to the controller" in out.message and "0:00:20 ago" in out.message


def test_controller_reached_round_trips_and_a_bad_one_is_named(tmp_path: Path) -> None:
    path = tmp_path / "node-status.json"
    st = NodeStatus("n1", NOW, "ok", controller_reached=NOW - timedelta(seconds=7))
    write_status(path, st)
    assert parse_status(path.read_text()) == st
    doc = {"format": "gpufleet.node-status/v1", "node": "n1", "worst": "ok", "time": "2026-11-21T12:00:00Z",
           "controller_reached": "yesterday"}
    with pytest.raises(InvalidInput) as err:
        parse_status(json.dumps(doc), "s")
    assert err.value.field == "s.controller_reached"
