"""unit namings: the correlator's repeat-offender history (docs/correlate.md §Repeat offenders)

* ``unit_namings``: one row per actionable verdict that named a replaceable unit, keyed by (serial,
  time, slot) so a controller that replays its correlation window records nothing twice.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 21:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('unit_namings',
    sa.Column('serial', sa.String(length=128), nullable=False),
    sa.Column('time', sa.DateTime(timezone=True), nullable=False),
    sa.Column('component', sa.String(length=256), nullable=False),
    sa.Column('kind', sa.String(length=64), nullable=False),
    sa.PrimaryKeyConstraint('serial', 'time', 'component'))


def downgrade() -> None:
    op.drop_table('unit_namings')
