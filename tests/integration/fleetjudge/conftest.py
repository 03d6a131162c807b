"""The store suite's backends (a SQLite file and, when configured, a real PostgreSQL) for the judge's read."""

from tests.integration.store.conftest import db_url, engine

__all__ = ["db_url", "engine"]  # their PostgreSQL: tests/integration/conftest.py
