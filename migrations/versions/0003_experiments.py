"""A/B experiments; batches.experiment_id, jobs.experiment_id and jobs.reference; a custom_id once per variant

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04 14:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('experiments',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('tenant', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('mode', sa.String(length=16), nullable=False),
    sa.Column('arms', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_experiments'))
    )
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_experiments_tenant'), ['tenant'], unique=False)
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.add_column(sa.Column('experiment_id', sa.String(length=64), nullable=True))
        batch_op.create_index(batch_op.f('ix_batches_experiment_id'), ['experiment_id'], unique=False)
        batch_op.create_foreign_key(batch_op.f('fk_batches_experiment_id_experiments'), 'experiments',
                                    ['experiment_id'], ['id'])
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('experiment_id', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('reference', sa.Text(), nullable=True))
        batch_op.drop_constraint('uq_jobs_batch_custom_id', type_='unique')
        batch_op.create_unique_constraint('uq_jobs_batch_custom_id_variant', ['batch_id', 'custom_id', 'variant'])
        batch_op.create_index(batch_op.f('ix_jobs_experiment_id'), ['experiment_id'], unique=False)
        batch_op.create_foreign_key(batch_op.f('fk_jobs_experiment_id_experiments'), 'experiments',
                                    ['experiment_id'], ['id'])


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('fk_jobs_experiment_id_experiments'), type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_jobs_experiment_id'))
        batch_op.drop_constraint('uq_jobs_batch_custom_id_variant', type_='unique')
        batch_op.create_unique_constraint('uq_jobs_batch_custom_id', ['batch_id', 'custom_id'])
        batch_op.drop_column('reference')
        batch_op.drop_column('experiment_id')
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('fk_batches_experiment_id_experiments'), type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_batches_experiment_id'))
        batch_op.drop_column('experiment_id')
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_experiments_tenant'))
    op.drop_table('experiments')
