"""one event path: node-scoped event ids, merged faults, node inventories

* ``events``: an event id is unique per reporting node (``UNIQUE (node, id)``), no longer fleet-wide,
  so one node's reporter can never make another node's event a duplicate; ``fault_of`` names the
  event (same node) this one was merged onto when two sources saw the same fault (NULL: it is a
  fault of its own).
* ``inventories``: the last inventory each node's agent registered (``gpufleet.inventory/v1``).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 18:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

_COLUMNS = ("seq, id, node, kind, time, component, code, severity, link, message, source, attrs, received")


def _events_table(name: str) -> None:
    op.create_table(name,
    sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('id', sa.String(length=200), nullable=False),
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('time', sa.DateTime(timezone=True), nullable=False),
    sa.Column('component', sa.String(length=200), nullable=True),
    sa.Column('code', sa.Integer(), nullable=True),
    sa.Column('severity', sa.String(length=16), nullable=True),
    sa.Column('link', sa.String(length=200), nullable=True),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('source', sa.String(length=64), nullable=False),
    sa.Column('attrs', sa.JSON(), nullable=False),
    sa.Column('received', sa.DateTime(timezone=True), nullable=False),
    sa.Column('fault_of', sa.String(length=200), nullable=True),
    sa.PrimaryKeyConstraint('seq'),
    sa.UniqueConstraint('node', 'id', name='uq_events_node_id'),
    )


def upgrade() -> None:
    # Copy into a new table (the old fleet-wide UNIQUE (id) has no portable name to drop).
    _events_table('events_v2')
    op.execute(f"INSERT INTO events_v2 ({_COLUMNS}) SELECT {_COLUMNS} FROM events")
    op.drop_table('events')
    op.rename_table('events_v2', 'events')
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index('ix_events_node_time', ['node', 'time'], unique=False)
    if op.get_bind().dialect.name == "postgresql":  # keep the serial counting from where it was
        op.execute("ALTER SEQUENCE IF EXISTS events_v2_seq_seq RENAME TO events_seq_seq")
        op.execute("SELECT setval('events_seq_seq', COALESCE((SELECT MAX(seq) FROM events), 0) + 1, false)")
    op.create_table('inventories',
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('doc', sa.JSON(), nullable=False),
    sa.Column('updated', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('node'),
    )


def downgrade() -> None:
    op.drop_table('inventories')
    op.drop_index('ix_events_node_time', table_name='events')
    op.rename_table('events', 'events_v2')
    op.create_table('events',
    sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('id', sa.String(length=200), nullable=False),
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('time', sa.DateTime(timezone=True), nullable=False),
    sa.Column('component', sa.String(length=200), nullable=True),
    sa.Column('code', sa.Integer(), nullable=True),
    sa.Column('severity', sa.String(length=16), nullable=True),
    sa.Column('link', sa.String(length=200), nullable=True),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('source', sa.String(length=64), nullable=False),
    sa.Column('attrs', sa.JSON(), nullable=False),
    sa.Column('received', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('seq'),
    sa.UniqueConstraint('id'),
    )
    op.execute(f"INSERT INTO events ({_COLUMNS}) SELECT {_COLUMNS} FROM events_v2")
    op.drop_table('events_v2')
    op.create_index('ix_events_node_time', 'events', ['node', 'time'], unique=False)
