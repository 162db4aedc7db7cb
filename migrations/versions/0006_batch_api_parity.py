"""batch API parity: list indexes, file deletion, batch expiry, key expiry and prefixes,
idempotency keys, webhook endpoints and deliveries

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05 17:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.add_column(sa.Column('expires_at', TS, nullable=True))
        batch_op.add_column(sa.Column('prefix', sa.String(length=16), nullable=True))
    with op.batch_alter_table('files', schema=None) as batch_op:
        batch_op.add_column(sa.Column('deleted_at', TS, nullable=True))
        batch_op.create_index('ix_files_tenant_created', ['tenant', 'created_at'], unique=False)
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.add_column(sa.Column('expired_at', TS, nullable=True))
        batch_op.create_index('ix_batches_tenant_created', ['tenant', 'created_at'], unique=False)
    op.create_table(
        'idempotency_keys',
        sa.Column('tenant', sa.String(length=64), nullable=False),
        sa.Column('key', sa.String(length=255), nullable=False),
        sa.Column('fingerprint', sa.String(length=64), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('response_status', sa.Integer(), nullable=True),
        sa.Column('response_body', sa.JSON(), nullable=True),
        sa.Column('created_at', TS, nullable=False),
        sa.Column('locked_until', TS, nullable=False),
        sa.Column('expires_at', TS, nullable=False),
        sa.PrimaryKeyConstraint('tenant', 'key', name=op.f('pk_idempotency_keys')),
    )
    op.create_index(op.f('ix_idempotency_keys_expires_at'), 'idempotency_keys', ['expires_at'], unique=False)
    op.create_table(
        'webhook_endpoints',
        sa.Column('id', sa.String(length=64), nullable=False),
        sa.Column('tenant', sa.String(length=64), nullable=False),
        sa.Column('url', sa.Text(), nullable=False),
        sa.Column('events', sa.JSON(), nullable=False),
        sa.Column('secret', sa.String(length=100), nullable=False),
        sa.Column('description', sa.String(length=200), nullable=False),
        sa.Column('created_at', TS, nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_endpoints')),
    )
    op.create_index(op.f('ix_webhook_endpoints_tenant'), 'webhook_endpoints', ['tenant'], unique=False)
    op.create_table(
        'webhook_deliveries',
        sa.Column('id', sa.String(length=64), nullable=False),
        sa.Column('endpoint_id', sa.String(length=64), nullable=False),
        sa.Column('tenant', sa.String(length=64), nullable=False),
        sa.Column('event_id', sa.String(length=64), nullable=False),
        sa.Column('event_type', sa.String(length=32), nullable=False),
        sa.Column('payload', sa.JSON(), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('next_attempt_at', TS, nullable=True),
        sa.Column('claimed_until', TS, nullable=True),
        sa.Column('attempt_log', sa.JSON(), nullable=False),
        sa.Column('created_at', TS, nullable=False),
        sa.Column('delivered_at', TS, nullable=True),
        sa.ForeignKeyConstraint(['endpoint_id'], ['webhook_endpoints.id'], ondelete='CASCADE',
                                name=op.f('fk_webhook_deliveries_endpoint_id_webhook_endpoints')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_deliveries')),
        sa.UniqueConstraint('endpoint_id', 'event_id', name='uq_webhook_deliveries_endpoint_event'),
    )
    op.create_index('ix_webhook_deliveries_due', 'webhook_deliveries', ['status', 'next_attempt_at'], unique=False)
    op.create_index(op.f('ix_webhook_deliveries_endpoint_id'), 'webhook_deliveries', ['endpoint_id'], unique=False)


def downgrade() -> None:
    op.drop_table('webhook_deliveries')
    op.drop_table('webhook_endpoints')
    op.drop_table('idempotency_keys')
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.drop_index('ix_batches_tenant_created')
        batch_op.drop_column('expired_at')
    with op.batch_alter_table('files', schema=None) as batch_op:
        batch_op.drop_index('ix_files_tenant_created')
        batch_op.drop_column('deleted_at')
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.drop_column('prefix')
        batch_op.drop_column('expires_at')
