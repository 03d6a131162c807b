"""initial schema

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-21 12:48:31.336443
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('actions',
    sa.Column('id', sa.String(length=128), nullable=False),
    sa.Column('decision_id', sa.String(length=64), nullable=False),
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('level', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('next_attempt', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=False),
    sa.Column('result', sa.Text(), nullable=False),
    sa.Column('created', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('actions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_actions_decision_id'), ['decision_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_actions_node'), ['node'], unique=False)
        batch_op.create_index(batch_op.f('ix_actions_status'), ['status'], unique=False)

    op.create_table('audit',
    sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('time', sa.DateTime(timezone=True), nullable=False),
    sa.Column('actor', sa.String(length=32), nullable=False),
    sa.Column('actor_id', sa.String(length=128), nullable=False),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('target', sa.String(length=200), nullable=False),
    sa.Column('detail', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('seq')
    )
    op.create_table('checkpoints',
    sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.String(length=128), nullable=False),
    sa.Column('time', sa.DateTime(timezone=True), nullable=False),
    sa.Column('received', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('seq')
    )
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_checkpoints_job_id'), ['job_id'], unique=False)

    op.create_table('decisions',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('time', sa.DateTime(timezone=True), nullable=False),
    sa.Column('from_state', sa.String(length=32), nullable=False),
    sa.Column('to_state', sa.String(length=32), nullable=False),
    sa.Column('rule', sa.String(length=64), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('severity', sa.String(length=16), nullable=False),
    sa.Column('actor', sa.String(length=32), nullable=False),
    sa.Column('actor_id', sa.String(length=128), nullable=False),
    sa.Column('evidence', sa.JSON(), nullable=False),
    sa.Column('actions', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('decisions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_decisions_node'), ['node'], unique=False)
        batch_op.create_index(batch_op.f('ix_decisions_status'), ['status'], unique=False)

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
    sa.UniqueConstraint('id')
    )
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index('ix_events_node_time', ['node', 'time'], unique=False)

    op.create_table('nodes',
    sa.Column('id', sa.String(length=128), nullable=False),
    sa.Column('rack', sa.String(length=128), nullable=False),
    sa.Column('domains', sa.JSON(), nullable=False),
    sa.Column('state', sa.String(length=32), nullable=False),
    sa.Column('since', sa.DateTime(timezone=True), nullable=False),
    sa.Column('has_jobs', sa.Boolean(), nullable=False),
    sa.Column('committed', sa.Boolean(), nullable=False),
    sa.Column('last_heartbeat', sa.DateTime(timezone=True), nullable=True),
    sa.Column('agent_version', sa.String(length=64), nullable=False),
    sa.Column('registered', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_nodes_state'), ['state'], unique=False)

    op.create_table('settings',
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('value', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('key')
    )
    op.create_table('transitions',
    sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('from_state', sa.String(length=32), nullable=False),
    sa.Column('to_state', sa.String(length=32), nullable=False),
    sa.Column('time', sa.DateTime(timezone=True), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('actor', sa.String(length=32), nullable=False),
    sa.Column('actor_id', sa.String(length=128), nullable=False),
    sa.Column('evidence', sa.JSON(), nullable=False),
    sa.Column('decision_id', sa.String(length=64), nullable=True),
    sa.PrimaryKeyConstraint('seq')
    )
    with op.batch_alter_table('transitions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_transitions_node'), ['node'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('transitions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_transitions_node'))

    op.drop_table('transitions')
    op.drop_table('settings')
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_nodes_state'))

    op.drop_table('nodes')
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index('ix_events_node_time')

    op.drop_table('events')
    with op.batch_alter_table('decisions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_decisions_status'))
        batch_op.drop_index(batch_op.f('ix_decisions_node'))

    op.drop_table('decisions')
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_checkpoints_job_id'))

    op.drop_table('checkpoints')
    op.drop_table('audit')
    with op.batch_alter_table('actions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_actions_status'))
        batch_op.drop_index(batch_op.f('ix_actions_node'))
        batch_op.drop_index(batch_op.f('ix_actions_decision_id'))

    op.drop_table('actions')
