"""leader lease: which controller replica leads, and its fencing epoch (docs/scale.md)

* ``leader_lease``: one row per lease (the controller's is named ``controller``): its holder, its
  epoch (grows with every new holder; the leader's writes check it) and when it expires.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 21:20:00
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table('leader_lease',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('holder', sa.String(length=256), nullable=False),
    sa.Column('epoch', sa.BigInteger(), nullable=False),
    sa.Column('expires', sa.DateTime(timezone=True), nullable=False),
    sa.Column('url', sa.String(length=1024), nullable=False),
    sa.PrimaryKeyConstraint('name'))
    op.bulk_insert(table, [{"name": "controller", "holder": "", "epoch": 0,
                            "expires": datetime(1970, 1, 1, tzinfo=UTC), "url": ""}])


def downgrade() -> None:
    op.drop_table('leader_lease')
