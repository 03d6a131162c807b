"""inventory references: the last complete inventory of each node (docs/formats.md, "Identities")

* ``inventories.reference``: the node's last inventory that reported every GPU and HCA slot. Its PCI
  addresses name the slots when a later inventory lacks a unit (a GPU fell off the bus), so the units
  after the gap keep their slots. NULL: the last inventory is the reference, or there is none yet.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07 23:55:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('inventories', sa.Column('reference', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('inventories') as batch:
        batch.drop_column('reference')
