"""jobs: an index for the fair-share claim order; idempotency_keys: the owning API process and
the running request's claim token and the resource it committed, so a dead owner's key is taken
over in seconds, safely

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07 08:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    columns = ['status', 'variant', 'tenant', 'created_at']
    if op.get_bind().dialect.name == 'postgresql':
        # Built beside the writes, not blocking them: a deployment's jobs table can be large.
        with op.get_context().autocommit_block():
            op.create_index('ix_jobs_fair_share', 'jobs', columns, unique=False, postgresql_concurrently=True)
    else:
        op.create_index('ix_jobs_fair_share', 'jobs', columns, unique=False)
    with op.batch_alter_table('idempotency_keys', schema=None) as batch_op:
        batch_op.add_column(sa.Column('owner', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('claim', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('resource', sa.String(length=80), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('idempotency_keys', schema=None) as batch_op:
        batch_op.drop_column('resource')
        batch_op.drop_column('claim')
        batch_op.drop_column('owner')
    op.drop_index('ix_jobs_fair_share', table_name='jobs')
