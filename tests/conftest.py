"""Shared test fixtures.

Services: a test that needs a real service (PostgreSQL, Slurm, Prometheus) asks for it through
:func:`require_service`. Locally, a missing service skips with the reason; in CI (``CI`` set) it fails,
because a skip there would hide a missing service.
"""

from __future__ import annotations

import os

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




def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``pytest -n N --dist loadgroup`` (``make test``): every ``slurm`` test runs in one worker
    (the group ``slurm``), so the session's Slurm lab starts once and two labs never compete for the
    cores; every other test is grouped with its module, so a module's (or a module-scoped fixture's)
    set-up runs once. Without xdist the marks change nothing."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        group = "slurm" if item.get_closest_marker("slurm") else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))
