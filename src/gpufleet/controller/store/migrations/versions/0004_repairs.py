"""repair executors: the agent command channel and the repair log

* ``commands``: repair commands for nodes' agents (``gpu_reset``, ``reboot``,
  ``restart_fabric_manager``). ``id`` is the repair step's key (outbox action id + attempt + step):
  queueing the same command twice is a no-op. ``status`` walks queued -> succeeded | failed | expired.
* ``repairs``: one row per repair attempt (a step carried out, with its outcome), what the escalation
  ladder counts (docs/lifecycle.md, "Repair without an operator"). ``key`` is unique: recording the
  same attempt again after a crash is a no-op.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 20:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('commands',
    sa.Column('id', sa.String(length=200), nullable=False),
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('created', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated', sa.DateTime(timezone=True), nullable=False),
    sa.Column('detail', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id'))
    op.create_index('ix_commands_node_status', 'commands', ['node', 'status'])
    op.create_table('repairs',
    sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('key', sa.String(length=200), nullable=False),
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('time', sa.DateTime(timezone=True), nullable=False),
    sa.Column('fault', sa.String(length=200), nullable=False),
    sa.Column('step', sa.String(length=32), nullable=False),
    sa.Column('ok', sa.Boolean(), nullable=False),
    sa.Column('detail', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('seq'),
    sa.UniqueConstraint('key', name='uq_repairs_key'))
    op.create_index('ix_repairs_node_time', 'repairs', ['node', 'time'])


def downgrade() -> None:
    op.drop_index('ix_repairs_node_time', table_name='repairs')
    op.drop_table('repairs')
    op.drop_index('ix_commands_node_status', table_name='commands')
    op.drop_table('commands')
