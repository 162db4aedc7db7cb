"""Where the shipped files are: the checkpoints, the eval sets and the Alembic migrations.

They are package data under `yue2_jobs/_shipped/`: in a source checkout its entries link to the
top-level `checkpoints/`, `data/` and `migrations/` folders, and a built wheel holds copies of
them (the checkpoints, the eval and test splits, the migrations; not the training corpora). So
an installed package finds them wherever it is installed, with no source checkout around.
"""

from __future__ import annotations

from pathlib import Path

SHIPPED = Path(__file__).resolve().parents[1] / "_shipped"
CHECKPOINTS = SHIPPED / "checkpoints"
DATA = SHIPPED / "data"
MIGRATIONS = SHIPPED / "migrations"
