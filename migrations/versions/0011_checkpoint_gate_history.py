"""checkpoint_versions: what the publish said (an expected change, a new tokenizer), where the
version came from and its validation figures; checkpoint_activations: what served when;
worker_processes.load_error: a worker that cannot load its checkpoint says why

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07 11:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('checkpoint_versions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('expect_change', sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column('tokenizer_change', sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column('source', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('report', sa.Text(), nullable=True))
    op.create_table(
        'checkpoint_activations',
        sa.Column('id', sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column('variant', sa.String(length=64), nullable=False),
        sa.Column('version', sa.String(length=64), nullable=False),
        sa.Column('how', sa.String(length=32), nullable=False),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index('ix_checkpoint_activations_variant', 'checkpoint_activations', ['variant', 'started_at'])
    with op.batch_alter_table('worker_processes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('load_error', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('worker_processes', schema=None) as batch_op:
        batch_op.drop_column('load_error')
    op.drop_index('ix_checkpoint_activations_variant', table_name='checkpoint_activations')
    op.drop_table('checkpoint_activations')
    with op.batch_alter_table('checkpoint_versions', schema=None) as batch_op:
        batch_op.drop_column('report')
        batch_op.drop_column('source')
        batch_op.drop_column('tokenizer_change')
        batch_op.drop_column('expect_change')
