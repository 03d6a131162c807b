"""maintenance rollouts: protected rolling maintenance (docs/maintenance.md)

* ``maintenance_rollouts``: one row per rollout, its spec (JSON) and state;
* ``maintenance_nodes``: each node of a rollout and the step it is at (the rollout resumes from these
  after a restart; the agent command's key is kept so the action is never queued twice).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26 21:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('maintenance_rollouts',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('actor', sa.String(length=128), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('created', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'))
    op.create_table('maintenance_nodes',
    sa.Column('rollout', sa.String(length=64), nullable=False),
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('step', sa.String(length=16), nullable=False),
    sa.Column('since', sa.DateTime(timezone=True), nullable=False),
    sa.Column('detail', sa.Text(), nullable=False),
    sa.Column('command', sa.String(length=200), nullable=False),
    sa.PrimaryKeyConstraint('rollout', 'node'))
    op.create_index('ix_maintenance_nodes_step', 'maintenance_nodes', ['step'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_maintenance_nodes_step', table_name='maintenance_nodes')
    op.drop_table('maintenance_nodes')
    op.drop_table('maintenance_rollouts')
