"""worker_processes.pid_space: which machine's process table a worker's pid belongs to

A node name is `<variant>-cpu0@<hostname>`; two hosts with one hostname (cloned images) would
share it, and a pid is only meaningful on the host that wrote it.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06 10:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('worker_processes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('pid_space', sa.String(length=80), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('worker_processes', schema=None) as batch_op:
        batch_op.drop_column('pid_space')
