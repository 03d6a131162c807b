"""indexes for the store's hot queries at fleet volume (bench/bench_store_plans.py, docs/scale.md)

* ``ix_events_time``: the correlation window, the policy's lookback and the week of moves read at
  start (``time >= since``) scanned the whole events table.
* ``ix_events_kind_time``: events of one kind (the API's ``?kind=``, the counted kinds, the moves).
* ``ix_audit_target_seq``: one target's audit lines, newest first.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 21:40:00
"""

from __future__ import annotations

from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_events_time', 'events', ['time'], unique=False)
    op.create_index('ix_events_kind_time', 'events', ['kind', 'time'], unique=False)
    op.create_index('ix_audit_target_seq', 'audit', ['target', 'seq'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_audit_target_seq', table_name='audit')
    op.drop_index('ix_events_kind_time', table_name='events')
    op.drop_index('ix_events_time', table_name='events')
