"""Fixtures for tests against the real Slurm lab (one lab per session; see lab.py)."""

from __future__ import annotations

import pytest

from gpufleet.schedulers.slurm import SlurmScheduler
from tests.integration.slurm.lab import SlurmLab, session_lab


@pytest.fixture
def lab(request: pytest.FixtureRequest) -> SlurmLab:
    lab = session_lab(request)
    lab.reset()
    return lab


@pytest.fixture
def sched(lab: SlurmLab) -> SlurmScheduler:
    return SlurmScheduler(slurm_conf=lab.slurm_conf)
