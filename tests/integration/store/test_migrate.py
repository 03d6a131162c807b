"""Migrations: idempotent, and they create exactly the schema the models describe."""

from __future__ import annotations

from sqlalchemy import inspect, text

from gpufleet.controller.store.db import make_engine, migrate, tables
from gpufleet.controller.store.models import Base


def test_migrate_creates_every_table_and_is_idempotent(empty_url: str) -> None:
    engine = make_engine(empty_url)
    try:
        assert tables(engine) == []
        migrate(engine)
        first = tables(engine)
        migrate(engine)  # a second run (a restart) changes nothing and does not fail
        migrate(engine)
        assert tables(engine) == first
        assert set(first) == set(Base.metadata.tables) | {"alembic_version"}
        with engine.connect() as conn:
            versions = conn.execute(text("select version_num from alembic_version")).scalars().all()
        assert versions == ["0001"]
    finally:
        engine.dispose()


def test_migrated_schema_matches_the_models(empty_url: str) -> None:
    """Columns, nullability, primary keys, unique constraints and indexes are what models.py declares."""
    engine = make_engine(empty_url)
    try:
        migrate(engine)
        insp = inspect(engine)
        for name, table in Base.metadata.tables.items():
            cols = {c["name"]: c for c in insp.get_columns(name)}
            assert set(cols) == {c.name for c in table.columns}, name
            for c in table.columns:
                assert cols[c.name]["nullable"] == c.nullable, f"{name}.{c.name} nullable"
            pk = insp.get_pk_constraint(name)["constrained_columns"]
            assert pk == [c.name for c in table.primary_key.columns], name
            want_idx = {tuple(c.name for c in i.columns) for i in table.indexes}
            got_idx = {tuple(i["column_names"]) for i in insp.get_indexes(name) if not i.get("unique")}
            assert want_idx <= got_idx, f"{name}: missing indexes {want_idx - got_idx}"
        uniques = {tuple(u["column_names"]) for u in insp.get_unique_constraints("events")}
        assert ("id",) in uniques, "events.id must be unique (the dedup key)"
    finally:
        engine.dispose()
