"""outbox progress: what a long-running action has done so far

* ``actions.progress``: a small JSON object of strings an action writes as it goes, so a restarted
  controller resumes it instead of starting it again: a drain waiting for a checkpoint records when
  it asked the job and its GPU-hours budget (docs/lifecycle.md); a validation records the Slurm job
  it submitted (docs/slurm.md). NULL for actions that finish in one step.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 19:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('actions') as batch:
        batch.add_column(sa.Column('progress', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('actions') as batch:
        batch.drop_column('progress')
