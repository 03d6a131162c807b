"""Fixtures: every store test runs once on SQLite (a temp file) and once on a real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from gpufleet.controller.store.db import make_engine, migrate
from tests.conftest import require_service
from tests.integration.store.backends import WHAT, Postgres

BACKENDS = [pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)]


def _url(backend: str, tmp_path: Path, postgres: Postgres | None, *, migrated: bool) -> Iterator[str]:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
        if migrated:
            engine = make_engine(url)
            migrate(engine)
            engine.dispose()
        yield url
        return
    require_service(postgres is not None, WHAT)
    assert postgres is not None
    with postgres.database(migrated=migrated) as url:
        yield url


@pytest.fixture(params=BACKENDS)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path, postgres: Postgres | None) -> Iterator[str]:
    """The URL of an empty database (no tables)."""
    yield from _url(request.param, tmp_path, postgres, migrated=False)


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path, postgres: Postgres | None) -> Iterator[str]:
    """The URL of a database at the newest schema revision, used by nothing else."""
    yield from _url(request.param, tmp_path, postgres, migrated=True)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    yield eng
    eng.dispose()
