"""`yue2 migrate`: Alembic's `upgrade head` on a URL, with the project's migrations/."""

from __future__ import annotations

from alembic import command
from alembic.config import Config

from yue2_jobs.core.config import ROOT


def alembic_config(url: str) -> Config:
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    cfg.attributes["url"] = url
    return cfg


def upgrade_head(url: str) -> str:
    command.upgrade(alembic_config(url), "head")
    return url
