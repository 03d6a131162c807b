"""Fixtures shared by the integration suites: the session's real PostgreSQL (store and HA), throwaway
TLS certificates (serve and HA)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import tlscerts
from tests.integration.store.backends import Postgres


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres | None]:
    """The test PostgreSQL (GPUFLEET_TEST_POSTGRES_URL), or None when none is configured."""
    pg = Postgres.from_env()
    yield pg
    if pg is not None:
        pg.close()


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    """A directory with a CA, a server certificate for 127.0.0.1 and an agent's client certificate
    (tlscerts.standard: ca.crt/key, server.crt/key, agent.crt/key)."""
    return tlscerts.standard(tmp_path / "tls")
