"""The storm tests' fork server (tests/integration/forkserver.py, decision 0121): each start is a process
of its own that runs the module's ``cli``, dies of SIGKILL and is gone once reaped; a child that fails
leaves its traceback in its log."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.forkserver import ForkServer


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ForkServer]:
    s = ForkServer("tests.integration.forkserver_probe", tmp_path / "server.log")
    try:
        yield s
    finally:
        s.close()


def _until(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_each_start_is_its_own_process_and_sigkill_ends_it(server: ForkServer, tmp_path: Path) -> None:
    pids = tmp_path / "a.pid", tmp_path / "b.pid"
    a = server.spawn(["wait", str(pids[0])], tmp_path / "a.log")
    b = server.spawn(["wait", str(pids[1])], tmp_path / "b.log")
    _until(lambda: all(p.exists() and p.read_text() for p in pids), "the children did not run cli")
    assert [int(p.read_text()) for p in pids] == [a.pid, b.pid]
    assert len({a.pid, b.pid, os.getpid()}) == 3
    assert a.alive() and b.alive()
    a.kill9()
    assert not a.alive() and b.alive()
    b.kill9()
    assert not b.alive()


def test_a_child_that_fails_logs_why_and_is_gone(server: ForkServer, tmp_path: Path) -> None:
    log = tmp_path / "c.log"
    c = server.spawn(["crash", str(tmp_path / "c.pid")], log)
    _until(lambda: not c.alive(), "the failed child is still there")
    assert "RuntimeError: the probe crashed on purpose" in log.read_text()


def test_a_module_without_cli_is_reported_with_the_servers_log(tmp_path: Path) -> None:
    s = ForkServer("tests.integration.crash", tmp_path / "server.log")  # a package with no cli
    try:
        with pytest.raises(AssertionError, match="has no attribute 'cli'"):
            s.spawn(["x"], tmp_path / "x.log")
    finally:
        s.close()
