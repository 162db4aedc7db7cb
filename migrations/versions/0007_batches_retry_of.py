"""batches.retry_of and retrying_since: a batch is retried at most once at a time

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06 01:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.add_column(sa.Column('retry_of', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('retrying_since', sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index('ix_batches_retry_of', ['retry_of'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.drop_index('ix_batches_retry_of')
        batch_op.drop_column('retrying_since')
        batch_op.drop_column('retry_of')
