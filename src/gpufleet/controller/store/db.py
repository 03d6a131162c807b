"""Database engines and migrations: SQLite file by default, PostgreSQL by URL."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.exc import ArgumentError, DisconnectionError, OperationalError
from sqlalchemy.pool import StaticPool

from gpufleet.domain.errors import ExternalError, InvalidInput

log = logging.getLogger(__name__)
MIGRATION_LOCK = 0x67706601  # pg_advisory_xact_lock key held while migrating ("gpf" 1)
MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def make_engine(url: str) -> Engine:
    """An engine for ``url`` (``sqlite:///path.db``, ``postgresql+psycopg://...``).

    SQLite runs in WAL mode with ``synchronous=FULL`` so a committed transaction survives kill -9.
    """
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    try:
        if url.startswith("sqlite"):
            engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
            event.listen(engine, "connect", _sqlite_pragmas)
        else:
            engine = create_engine(url, pool_size=10, max_overflow=20)
            _ping_when_idle(engine)
    except ImportError as err:  # a valid URL whose driver is not installed
        expected = (f"a database whose driver is installed: for postgresql://, pip install 'gpufleet[postgres]' "
                    f"(psycopg) ({err})")
        raise InvalidInput("database_url", _redact(url), expected) from None
    except ArgumentError as err:
        expected = f"a SQLAlchemy URL such as sqlite:///gpufleet.db or postgresql://... ({err})"
        raise InvalidInput("database_url", _redact(url), expected) from None
    return engine


PING_AFTER_IDLE_S = 10.0


def _ping_when_idle(engine: Engine) -> None:
    """Check a pooled connection before use only if it sat idle for ``PING_AFTER_IDLE_S``.

    ``pool_pre_ping`` would cost every checkout a round trip (one per ingest round, which is most of
    the traffic), and one in constant use is very likely alive. A connection that died while idle is
    replaced here without an error; one that dies in use fails that one round, SQLAlchemy then
    recycles every pooled connection, and the agents send the round again (they retry until answered).
    """

    @event.listens_for(engine, "checkin")
    def _checkin(_dbapi_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("idle_since")
        if since is None or time.monotonic() - since < PING_AFTER_IDLE_S:
            return
        try:
            cur = dbapi_conn.cursor()
            cur.execute("SELECT 1")
            cur.close()
            dbapi_conn.rollback()
        except Exception as err:
            raise DisconnectionError(f"pooled connection was dead after {time.monotonic() - since:.0f}s idle") from err


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def migrate(engine: Engine, revision: str = "head") -> tuple[str | None, str | None]:
    """Bring the schema to the newest revision, or to ``revision`` (idempotent); returns the revision
    before and after (None: no schema). A schema newer than this gpufleet knows (a rollback onto a
    database a newer release migrated) is an InvalidInput naming it, before anything is changed."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    script = ScriptDirectory.from_config(cfg)
    known = {r.revision for r in script.walk_revisions()}
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":  # replicas starting together migrate one after the other
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
            before = MigrationContext.configure(conn).get_current_revision()
            if before is not None and before not in known:
                raise InvalidInput("database schema", before,
                                   f"revision {script.get_current_head()} or older, the newest this gpufleet knows: "
                                   "the database was migrated by a newer release; run that release, or restore "
                                   "the backup taken before the upgrade")
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            after = MigrationContext.configure(conn).get_current_revision()
    except OperationalError as err:
        raise ExternalError("database", f"cannot migrate {_redact(str(engine.url))}: {err.orig}") from None
    if before != after:
        log.info("database schema %s -> %s (%s)", before or "none", after, _redact(str(engine.url)))
    return before, after


def brief(err: BaseException) -> str:
    """A database error as an answer or a short log line may show it: the driver's first line, never the
    SQL statement and its parameters (SQLAlchemy appends both to its errors' text; they may hold what
    a caller sent)."""
    orig = getattr(err, "orig", None)
    lines = str(orig if orig is not None else err).strip().splitlines()
    first = lines[0] if lines else ""
    if first.startswith("[SQL:"):
        first = ""
    text = f"{type(orig if orig is not None else err).__name__}: {first}" if first else type(err).__name__
    return text if len(text) <= 300 else text[:300] + "..."


def tables(engine: Engine) -> list[str]:
    return sorted(inspect(engine).get_table_names())


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}" if ":" in creds else url
    return url


def throwaway_engine() -> Engine:
    """An in-memory SQLite engine for unit tests and the simulator (one shared connection)."""
    return create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})
