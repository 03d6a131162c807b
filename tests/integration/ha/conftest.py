"""HA tests run on the real PostgreSQL CI provides (GPUFLEET_TEST_POSTGRES_URL), one schema per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import require_service
from tests.integration.store.backends import WHAT, Postgres


@pytest.fixture
def pg_url(postgres: Postgres | None) -> Iterator[str]:
    """A migrated database of its own (a schema) on the test PostgreSQL."""
    require_service(postgres is not None, WHAT)
    assert postgres is not None
    with postgres.database(migrated=True) as url:
        yield url
