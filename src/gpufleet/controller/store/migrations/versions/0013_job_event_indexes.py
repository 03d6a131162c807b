"""indexes for a job's infrastructure events (``GET /v1/jobs/{job}/events``, Store.newest_on)

* ``ix_transitions_node_time``: the transitions of a job's nodes in a time range (only ``node`` was
  indexed: every transition the nodes ever had was read, then filtered on time).
* ``ix_actions_node_created``: the outbox actions of a job's nodes queued in a time range (the same).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 10:00:00
"""

from __future__ import annotations

from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_transitions_node_time', 'transitions', ['node', 'time'], unique=False)
    op.create_index('ix_actions_node_created', 'actions', ['node', 'created'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_actions_node_created', table_name='actions')
    op.drop_index('ix_transitions_node_time', table_name='transitions')
