"""Shared test fixtures.

Services: a test that needs a real service (PostgreSQL, Slurm, Prometheus) asks for it through
:func:`require_service`. Locally, a missing service skips with the reason; in CI (``CI`` set) it fails,
because a skip there would hide a missing service.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def require_service(available: bool, what: str) -> None:
    """Skip (locally) or fail (in CI) when ``what`` is not available."""
    if available:
        return
    if in_ci():
        pytest.fail(f"{what} is required in CI but is not available", pytrace=False)
    pytest.skip(f"{what} not available (CI would fail here)")


@pytest.fixture(autouse=True)
def _gpufleet_loggers_enabled() -> None:
    """A library that configures logging with ``disable_existing_loggers`` (the stdlib's default) turns
    off every logger that existed before it ran; tests that read gpufleet's log lines need them on."""
    import logging

    for name, logger in list(logging.root.manager.loggerDict.items()):
        if name.startswith("gpufleet") and isinstance(logger, logging.Logger):
            logger.disabled = False


# ---- make test: two pytest-xdist workers, every Slurm test in one of them ------------------------------
# The session's Slurm lab starts once per test process; two labs would compete for the cores. xdist's own
# grouping by mark (--dist loadgroup) does not work with pytest 9.2 (it renames the test ids through an
# attribute pytest no longer reads), so the grouping is a scheduler: a test file that names the lab or the
# slurm mark (or a test id with a Slurm parameter, the contract suite's) runs whole in the group "slurm";
# every other file is a group of its own. Every slurm-marked test is checked to fall in that group.

_SLURM_FILES: dict[str, bool] = {}


def in_slurm_group(nodeid: str) -> bool:
    """Whether the test ``nodeid`` (rootdir-relative) runs in the worker that holds the Slurm lab."""
    if "[slurm" in nodeid:
        return True
    path = nodeid.split("::", 1)[0]
    if path not in _SLURM_FILES:
        try:
            text = (Path(__file__).resolve().parents[1] / path).read_text(encoding="utf-8")
        except OSError:
            text = ""
        _SLURM_FILES[path] = "mark.slurm" in text or "slurm_lab" in text
    return _SLURM_FILES[path]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a slurm-marked test that the scheduler would not send to the lab's worker."""
    gone = [f for f in LONG_FIRST[1:] if not (Path(__file__).resolve().parents[1] / f).is_file()]
    if gone:
        raise pytest.UsageError(f"tests/conftest.py LONG_FIRST names files that are not there: {gone}")
    stray = [i.nodeid for i in items if i.get_closest_marker("slurm") and not in_slurm_group(i.nodeid)]
    if stray:
        raise pytest.UsageError(f"slurm tests outside the Slurm group (tests/conftest.py in_slurm_group): {stray[:5]}; "
                                "name pytest.mark.slurm in their file")


# Started first, longest first (a work queue ends soonest when its long units start early): the Slurm group,
# then the files that took 30 s or more in a CI run (.ci/run on the 2-core box, 2026-11-28). The rest follow
# in xdist's order (most tests first). Only the order changes: every test still runs, once.
LONG_FIRST = (
    "slurm",
    "tests/integration/api/test_schema_fuzz.py",
    "tests/integration/compiled/test_compiled_build.py",
    "tests/integration/ha/test_failover.py",
    "tests/e2e/test_goodput_trackers.py",
    "tests/integration/goodput/test_train_e2e.py",
    "tests/e2e/test_loop_crash.py",
    "tests/integration/crash/test_crash_safety.py",
    "tests/integration/chaos/test_database_outage.py",
    "tests/integration/sim/test_sweep.py",
    "tests/e2e/test_maintenance_crash.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class SlurmTogether(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return "slurm" if in_slurm_group(nodeid) else nodeid.split("::", 1)[0]

        def _assign_work_unit(self, node: Any) -> None:
            queue = self.workqueue
            first = next((scope for scope in LONG_FIRST if scope in queue), None)
            if first is not None:
                queue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

    return SlurmTogether(config, log)
