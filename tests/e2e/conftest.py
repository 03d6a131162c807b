"""Fixtures for the end-to-end tests (marker ``e2e``): real controller and agent processes.

``fleet`` starts nothing by itself; a test starts the controller and agents it needs through it
(see ``harness.py``). Every process is stopped by its PID when the test ends, and when a test fails
each process's log is attached to its report. ``slurm_lab`` is the session's real Slurm lab
(tests/integration/slurm/lab.py), reset for the test; in CI a missing Slurm fails the test.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import Fleet
from tests.integration.slurm.lab import SlurmLab, session_lab

_FLEET = pytest.StashKey[Fleet]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport,
                                                                                          pytest.TestReport]:
    report = yield
    fleet = item.stash.get(_FLEET, None)
    if fleet is not None and report.failed:
        for name, text in fleet.logs():
            report.sections.append((f"e2e log: {name}", text))
    return report


@pytest.fixture
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path)
    request.node.stash[_FLEET] = f
    try:
        yield f
    finally:
        problems = f.close()
    assert not problems, f"unclean shutdown: {problems}"


@pytest.fixture
def slurm_lab(request: pytest.FixtureRequest) -> SlurmLab:
    lab = session_lab(request)
    lab.reset()
    return lab
