"""A migrated SQLite database per test module (`tests.sqlite_db`)."""

from tests.sqlite_db import session, sessions  # noqa: F401 - fixtures
