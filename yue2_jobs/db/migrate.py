"""`yue2 migrate`: Alembic's `upgrade head` on a URL, with the migrations shipped in the package."""

from __future__ import annotations

from alembic import command
from alembic.config import Config

from yue2_jobs.core.paths import MIGRATIONS


def alembic_config(url: str) -> Config:
    cfg = Config()  # no alembic.ini needed: an installed package has none
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["url"] = url
    return cfg


def upgrade_head(url: str) -> str:
    command.upgrade(alembic_config(url), "head")
    return url
