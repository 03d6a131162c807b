"""The test scheduler's order (tests/conftest.py): the durations file names real groups, and the longest
groups are handed out first, whatever their number of tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DURATIONS, UNKNOWN_S, pytest_xdist_make_scheduler, scope_costs, scope_of

ROOT = Path(__file__).resolve().parents[2]


def test_every_group_in_the_durations_file_is_a_test_file_or_the_slurm_group() -> None:
    costs = scope_costs()
    assert DURATIONS.is_file() and costs, "tests/durations.json is missing or empty"
    stale = [k for k in costs if k != "slurm" and not (ROOT / k).is_file()]
    assert not stale, f"groups with no test file (rerun scripts/test_durations.py): {stale}"
    assert all(v > 0 for v in costs.values())
    assert scope_of("tests/integration/slurm/test_adapter_real.py::test_x") == "slurm"
    assert scope_of("tests/unit/test_test_order.py::test_x") == "tests/unit/test_test_order.py"


def test_the_longest_group_is_handed_out_first() -> None:
    pytest.importorskip("xdist")

    class Config:
        class option:  # noqa: N801 (what xdist reads)
            loadscopereorder = True
            dist = "loadscope"
            tx = ["2*popen"]
            numprocesses = 2
            maxschedchunk = None

        def getvalue(self, name: str) -> Any:
            return getattr(self.option, name, None)

    costs = scope_costs()
    long_file = max((k for k in costs if k != "slurm"), key=costs.__getitem__)
    sched: Any = pytest_xdist_make_scheduler(Config(), None)
    many = {f"tests/unit/test_many.py::test_{i}": False for i in range(int(costs[long_file] / UNKNOWN_S) - 10)}
    sched.workqueue.update({"tests/unit/test_many.py": many, long_file: {f"{long_file}::test_a": False}})
    sent: list[str] = []

    class Node:
        def send_runtest_some(self, indexes: list[int]) -> None:
            sent.append(collection[indexes[0]])

    collection = [*many, f"{long_file}::test_a"]
    node = Node()
    sched.registered_collections[node] = collection
    sched._assign_work_unit(node)
    assert sent == [f"{long_file}::test_a"]  # by its seconds, though the other has more tests
