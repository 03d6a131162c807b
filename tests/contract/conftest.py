"""The ``harness`` fixture: one scheduler harness per implementation of the scheduler port.

Add an implementation by adding its name to ``IMPLEMENTATIONS`` and a branch in ``harness``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.contract.harness import SchedulerHarness, SimHarness

IMPLEMENTATIONS = ["sim"]


@pytest.fixture(params=IMPLEMENTATIONS)
def harness(request: pytest.FixtureRequest) -> Iterator[SchedulerHarness]:
    if request.param == "sim":
        yield SimHarness.create()
    else:  # pragma: no cover - a name listed above without a branch is a bug in this file
        raise AssertionError(f"no harness for {request.param}")
