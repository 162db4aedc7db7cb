"""worker_placements: where each worker process last ran (host, machine, CPU set and model,
device), kept after it stops, so an A/B report can tell whether two arms' latencies compare

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 16:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'worker_placements',
        sa.Column('name', sa.String(length=200), nullable=False),
        sa.Column('host', sa.String(length=200), nullable=False),
        sa.Column('machine', sa.String(length=64), nullable=True),
        sa.Column('cpus', sa.JSON(), nullable=False),
        sa.Column('cpu_count', sa.Integer(), nullable=False),
        sa.Column('cpu_model', sa.String(length=200), nullable=True),
        sa.Column('device', sa.String(length=32), nullable=False),
        sa.Column('device_name', sa.String(length=200), nullable=True),
        sa.Column('device_uuid', sa.String(length=64), nullable=True),
        sa.Column('recorded_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('name', name=op.f('pk_worker_placements')),
    )


def downgrade() -> None:
    op.drop_table('worker_placements')
