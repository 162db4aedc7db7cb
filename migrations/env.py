"""Alembic environment: the app's metadata and the URL from YUE2_DATABASE_URL (or -x url=...)."""

from __future__ import annotations

from alembic import context

from yue2_jobs.core.config import get_settings
from yue2_jobs.db import models_api  # noqa: F401  (registers its tables on Base.metadata)
from yue2_jobs.db.models import Base
from yue2_jobs.db.session import make_engine

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    return context.get_x_argument(as_dictionary=True).get("url") or config.attributes.get("url") \
        or get_settings().resolved_database_url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(_url())
    with engine.connect() as connection:
        # render_as_batch: SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
