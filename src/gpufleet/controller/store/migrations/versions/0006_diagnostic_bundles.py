"""diagnostic bundles: what a node's agent captured when it entered repair (docs/bmc.md)

* ``bundles``: one row per capture, keyed by the capture command's key (``<repair action>:bundle``);
  ``data`` is the gzip of the bundle's JSON (at most ``MAX_BUNDLE_BYTES``), ``sha256`` of ``data``.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 00:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('bundles',
    sa.Column('id', sa.String(length=200), nullable=False),
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('action_id', sa.String(length=200), nullable=False),
    sa.Column('created', sa.DateTime(timezone=True), nullable=False),
    sa.Column('size', sa.Integer(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('summary', sa.Text(), nullable=False),
    sa.Column('data', sa.LargeBinary(), nullable=False),
    sa.PrimaryKeyConstraint('id'))
    op.create_index('ix_bundles_node', 'bundles', ['node'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_bundles_node', table_name='bundles')
    op.drop_table('bundles')
