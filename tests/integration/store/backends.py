"""Database backends for the store suite: a SQLite file and a real PostgreSQL.

PostgreSQL comes from ``GPUFLEET_TEST_POSTGRES_URL`` (``.ci/run`` sets it through ``scripts/pg-lab.sh up``).
Each test gets its own schema in that database (``CREATE SCHEMA``, dropped afterwards) and a URL whose
``search_path`` points at it — so tests never see each other's rows, even when several test runs share
one server, and no test pays for a ``CREATE DATABASE``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, make_url, text
from sqlalchemy.exc import OperationalError

from gpufleet.controller.store.db import make_engine, migrate

ENV = "GPUFLEET_TEST_POSTGRES_URL"
WHAT = "PostgreSQL (GPUFLEET_TEST_POSTGRES_URL)"


class Postgres:
    """Creates and drops throwaway schemas on the database behind ``url``."""

    def __init__(self, url: str) -> None:
        self.url = make_url(url)
        self.admin = create_engine(self.url, isolation_level="AUTOCOMMIT", pool_size=1, max_overflow=0)

    @classmethod
    def from_env(cls) -> Postgres | None:
        url = os.environ.get(ENV, "")
        if not url:
            return None
        pg = cls(url)
        try:
            with pg.admin.connect() as conn:
                conn.execute(text("select 1"))
        except OperationalError:
            pg.admin.dispose()
            return None
        return pg

    def url_of(self, schema: str) -> str:
        """A URL whose connections use ``schema`` (libpq ``options=-csearch_path=...``)."""
        url = self.url.update_query_dict({"options": f"-csearch_path={schema}"})
        return url.render_as_string(hide_password=False)

    @contextmanager
    def database(self, *, migrated: bool) -> Iterator[str]:
        schema = f"gpufleet_t_{uuid.uuid4().hex[:12]}"
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        url = self.url_of(schema)
        try:
            if migrated:
                engine = make_engine(url)
                try:
                    migrate(engine)
                finally:
                    engine.dispose()
            yield url
        finally:
            with self.admin.connect() as conn:
                conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))

    def close(self) -> None:
        self.admin.dispose()
