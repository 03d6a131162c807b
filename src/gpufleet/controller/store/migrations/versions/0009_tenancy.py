"""tenancy: who owns a node since its last move, and the moves (docs/tenancy.md)

* ``node_tenants``: one row per node that was ever moved; ``tenant`` NULL while its move runs and after
  one failed (no tenant-scoped token sees the node).
* ``tenancy_moves``: each move, the maintenance rollout that reprovisions the node, and its outcome.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 21:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('node_tenants',
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('tenant', sa.String(length=64), nullable=True),
    sa.Column('since', sa.DateTime(timezone=True), nullable=False),
    sa.Column('move', sa.String(length=64), nullable=False),
    sa.PrimaryKeyConstraint('node'))
    op.create_table('tenancy_moves',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('from_tenant', sa.String(length=64), nullable=True),
    sa.Column('to_tenant', sa.String(length=64), nullable=False),
    sa.Column('rollout', sa.String(length=64), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('detail', sa.Text(), nullable=False),
    sa.Column('actor', sa.String(length=128), nullable=False),
    sa.Column('created', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'))
    op.create_index('ix_tenancy_moves_node', 'tenancy_moves', ['node'], unique=False)
    op.create_index('ix_tenancy_moves_state', 'tenancy_moves', ['state'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_tenancy_moves_state', table_name='tenancy_moves')
    op.drop_index('ix_tenancy_moves_node', table_name='tenancy_moves')
    op.drop_table('tenancy_moves')
    op.drop_table('node_tenants')
