"""goodput intervals: what training jobs report to ``POST /v1/jobs/{id}/goodput``

* ``goodput_intervals``: one row per final interval of a run (docs/goodput.md, "Push to the
  controller"): productive seconds, badput seconds by category (JSON), steps, their time, FLOPs and
  peak, world size. ``(job_id, run, start)`` is unique: the idempotency key of the push. Indexed by
  ``end`` for the roll-up over a time range.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 23:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('goodput_intervals',
    sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.String(length=128), nullable=False),
    sa.Column('run', sa.String(length=128), nullable=False),
    sa.Column('start', sa.DateTime(timezone=True), nullable=False),
    sa.Column('end', sa.DateTime(timezone=True), nullable=False),
    sa.Column('productive', sa.Float(), nullable=False),
    sa.Column('badput', sa.JSON(), nullable=False),
    sa.Column('steps', sa.Integer(), nullable=False),
    sa.Column('step_s', sa.Float(), nullable=False),
    sa.Column('flops', sa.Float(), nullable=True),
    sa.Column('peak_flops', sa.Float(), nullable=True),
    sa.Column('world', sa.Integer(), nullable=False),
    sa.Column('received', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('seq'),
    sa.UniqueConstraint('job_id', 'run', 'start', name='uq_goodput_job_run_start'))
    op.create_index('ix_goodput_intervals_end', 'goodput_intervals', ['end'])


def downgrade() -> None:
    op.drop_index('ix_goodput_intervals_end', table_name='goodput_intervals')
    op.drop_table('goodput_intervals')
