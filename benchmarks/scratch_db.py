"""A throwaway Postgres database for a benchmark run: created and migrated, dropped afterwards."""

from __future__ import annotations

import uuid
from dataclasses import dataclass


@dataclass
class ScratchDatabase:
    name: str
    url: str
    admin_url: str

    @classmethod
    def create(cls, admin_url: str, prefix: str) -> ScratchDatabase:
        """A new database beside `admin_url`'s, at the newest schema."""
        from sqlalchemy import create_engine, text

        from yue2_jobs.db.migrate import upgrade_head

        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        db = cls(name=name, url=admin_url.rsplit("/", 1)[0] + f"/{name}", admin_url=admin_url)
        upgrade_head(db.url)
        return db

    def drop(self) -> None:
        from sqlalchemy import create_engine, text

        from yue2_jobs.db.session import engine_for

        engine_for(self.url).dispose()
        admin = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        admin.dispose()
