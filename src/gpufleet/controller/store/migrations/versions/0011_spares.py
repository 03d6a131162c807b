"""hot-spare pools: each pool node's role (docs/spares.md)

* ``spare_nodes``: one row per node a pool holds as a spare, or is reclaiming, or has reclaimed for a
  failed node (with the reclaim's last step done, so a restarted controller does nothing twice).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26 22:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('spare_nodes',
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('pool', sa.String(length=64), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('replaces', sa.String(length=128), nullable=False),
    sa.Column('step', sa.String(length=32), nullable=False),
    sa.Column('since', sa.DateTime(timezone=True), nullable=False),
    sa.Column('detail', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('node'))
    op.create_index('ix_spare_nodes_pool', 'spare_nodes', ['pool'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_spare_nodes_pool', table_name='spare_nodes')
    op.drop_table('spare_nodes')
