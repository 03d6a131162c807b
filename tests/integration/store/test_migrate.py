"""Migrations: idempotent, and they create exactly the schema the models describe."""

from __future__ import annotations

from sqlalchemy import Engine, inspect, text

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
        assert versions == ["0014"]
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
        assert ("node", "id") in uniques, "(events.node, events.id) must be unique (the dedup key)"
        assert ("id",) not in uniques, "an event id is scoped to its node, not unique fleet-wide"
    finally:
        engine.dispose()


def _to(engine: Engine, revision: str, *, down: bool = False) -> None:
    """Upgrade (or downgrade) ``engine``'s schema to ``revision`` with our migrations."""
    from alembic import command
    from alembic.config import Config

    from gpufleet.controller.store.db import MIGRATIONS

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)


def test_0002_keeps_the_events_of_a_0001_database_and_scopes_ids_to_their_node(empty_url: str) -> None:
    engine = make_engine(empty_url)
    try:
        _to(engine, "0001")
        row = ("'{}'", "'2026-11-21 12:00:00+00:00'")
        with engine.begin() as conn:
            for seq, node in ((7, "r01-n01"), (9, "r01-n02")):
                conn.execute(text(
                    "insert into events (seq, id, node, kind, time, message, source, attrs, received) values "
                    f"({seq}, 'e{seq}', '{node}', 'xid', {row[1]}, '', 'agent', {row[0]}, {row[1]})"))
        migrate(engine)
        with engine.begin() as conn:
            kept = conn.execute(text("select seq, id, node, fault_of from events order by seq")).all()
            assert [tuple(r) for r in kept] == [(7, "e7", "r01-n01", None), (9, "e9", "r01-n02", None)]
            # the same id on another node is a different event now; a new row numbers after the old ones
            conn.execute(text("insert into events (id, node, kind, time, message, source, attrs, received) "
                              f"values ('e7', 'r01-n02', 'xid', {row[1]}, '', 'agent', {row[0]}, {row[1]})"))
            seqs = conn.execute(text("select seq from events where id = 'e7' order by seq")).scalars().all()
            assert len(seqs) == 2 and seqs[1] > 9
    finally:
        engine.dispose()


def test_0014_keeps_the_inventories_of_a_0013_database_and_downgrades(empty_url: str) -> None:
    from gpufleet.controller.store.repo import Store
    from gpufleet.domain.inventory import GpuUnit, NodeInventory

    engine = make_engine(empty_url)
    try:
        _to(engine, "0013")
        doc = '{"format": "gpufleet.inventory/v1", "node": "r01-n01", "gpus": [{"index": 0, "serial": "G0"}]}'
        with engine.begin() as conn:
            conn.execute(text("insert into inventories (node, doc, updated) values "
                              f"('r01-n01', '{doc}', '2026-12-07 12:00:00+00:00')"))
        migrate(engine)
        kept = NodeInventory("r01-n01", gpus=(GpuUnit(0, serial="G0"),))
        assert Store(engine).load_inventories() == [kept]  # no reference: the last inventory is all there is
        _to(engine, "0013", down=True)
        assert "reference" not in {c["name"] for c in inspect(engine).get_columns("inventories")}
    finally:
        engine.dispose()
