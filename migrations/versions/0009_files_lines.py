"""files.lines: an upload's line count, so a batch over the line limit is refused before its file is read

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06 11:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('files', schema=None) as batch_op:
        batch_op.add_column(sa.Column('lines', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('files', schema=None) as batch_op:
        batch_op.drop_column('lines')
