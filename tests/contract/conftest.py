"""The ``harness`` fixture: one scheduler harness per implementation of the scheduler port.

Add an implementation by adding its name to ``IMPLEMENTATIONS`` and a branch in ``harness``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.contract.harness import SchedulerHarness, SimHarness, SlurmHarness

# The real Slurm lab is started once per session (tests.integration.slurm.lab.session_lab); its
# tests carry the ``slurm`` marker, skip locally without Slurm and fail in CI.
# "slurm-rest" is the same adapter reading through slurmrestd instead of sinfo/squeue.
IMPLEMENTATIONS = [
    "sim",
    pytest.param("slurm", marks=pytest.mark.slurm),
    pytest.param("slurm-rest", marks=pytest.mark.slurm),
    # The Kubernetes adapter and the official client over HTTP against the in-process fake API server
    # (tests/k8s/fakeapi.py); no cluster needed, so it always runs.
    pytest.param("kubernetes-fake", marks=pytest.mark.kubernetes),
]


@pytest.fixture(params=IMPLEMENTATIONS)
def harness(request: pytest.FixtureRequest) -> Iterator[SchedulerHarness]:
    if request.param == "sim":
        yield SimHarness.create()
    elif request.param in ("slurm", "slurm-rest"):
        from tests.integration.slurm.lab import session_lab

        yield SlurmHarness.create(session_lab(request), rest=request.param == "slurm-rest")
    elif request.param == "kubernetes-fake":
        from tests.k8s.harness import KubernetesHarness

        kube = KubernetesHarness.create()
        try:
            yield kube
        finally:
            kube.close()
    else:  # pragma: no cover - a name listed above without a branch is a bug in this file
        raise AssertionError(f"no harness for {request.param}")
