"""Fixtures shared by the integration suites (store and HA): the session's real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.store.backends import Postgres


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres | None]:
    """The test PostgreSQL (GPUFLEET_TEST_POSTGRES_URL), or None when none is configured."""
    pg = Postgres.from_env()
    yield pg
    if pg is not None:
        pg.close()
