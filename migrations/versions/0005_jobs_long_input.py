"""jobs.input_tokens_used, input_truncated, chunks: what a job's long_input setting did to its input

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04 23:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('input_tokens_used', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('input_truncated', sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column('chunks', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('chunks')
        batch_op.drop_column('input_truncated')
        batch_op.drop_column('input_tokens_used')
