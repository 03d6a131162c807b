"""A database_url the store cannot use is named with what was expected: a URL SQLAlchemy does not parse,
or a PostgreSQL URL whose driver (the ``postgres`` extra) is not installed."""

from __future__ import annotations

import sys

import pytest

from gpufleet.controller.store.db import make_engine
from gpufleet.domain.errors import InvalidInput


def test_a_postgresql_url_without_its_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "psycopg" or m.startswith("psycopg.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg now raises ImportError
    with pytest.raises(InvalidInput) as err:
        make_engine("postgresql://gpufleet:secret@db.example:5432/gpufleet")
    assert err.value.field == "database_url"
    assert "gpufleet[postgres]" in str(err.value) and "secret" not in str(err.value)


def test_a_url_sqlalchemy_cannot_parse_says_what_a_url_looks_like() -> None:
    with pytest.raises(InvalidInput) as err:
        make_engine("not a url")
    assert err.value.field == "database_url" and "sqlite:///" in str(err.value)
    assert "gpufleet[postgres]" not in str(err.value)
