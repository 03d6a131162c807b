"""Alembic environment: runs against the connection the Store passes in (``config.attributes``)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from gpufleet.controller.store.models import Base

connection: Connection | None = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("gpufleet migrations run through gpufleet.controller.store.db.migrate()")
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
