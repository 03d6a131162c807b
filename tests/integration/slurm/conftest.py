"""Fixtures for tests against the real Slurm lab (one lab per session; see lab.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpufleet.schedulers.slurm import SlurmScheduler
from tests.integration.slurm.lab import FLEET_NODES, SlurmLab, session_lab, start_lab


@pytest.fixture
def lab(request: pytest.FixtureRequest) -> SlurmLab:
    lab = session_lab(request)
    lab.reset()
    return lab


@pytest.fixture
def sched(lab: SlurmLab) -> SlurmScheduler:
    return SlurmScheduler(slurm_conf=lab.slurm_conf)


@pytest.fixture(scope="module")
def _fleet_lab() -> Iterator[SlurmLab]:
    """A second lab of ``FLEET_NODES`` slurmd (no ghost node), started once for the module that asks for
    it and torn down after it (``down --purge``: every daemon and job process by PID, the dir removed)."""
    lab = start_lab(FLEET_NODES, ghost=False)
    try:
        yield lab
    finally:
        lab.down()


@pytest.fixture
def fleet_lab(_fleet_lab: SlurmLab) -> SlurmLab:
    """The module's eight-node lab, reset for this test (no jobs, every node idle and undrained)."""
    _fleet_lab.reset()
    return _fleet_lab
