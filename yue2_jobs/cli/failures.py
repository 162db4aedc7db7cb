"""What the `yue2` command prints when a command fails: one line that says what to do.

Our own errors carry their message already; the foreign ones a command meets (a missing file, a
database never migrated or not running, an API not listening) are named here with their fix. The
classes are matched by name so that a command that never touched SQLAlchemy or httpx does not pay
for importing them.
"""

from __future__ import annotations

from yue2_jobs.errors import Yue2Error

DEBUG_HINT = " (YUE2_DEBUG=1 shows the traceback)"


def one_line(exc: BaseException) -> str:
    """`exc` as one line for a person at a terminal."""
    if isinstance(exc, Yue2Error):
        return _flat(str(exc))
    if isinstance(exc, FileNotFoundError):
        return f"no such file: {exc.filename}"
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc.filename}"
    if isinstance(exc, IsADirectoryError):
        return f"{exc.filename} is a directory, not a file"
    if isinstance(exc, TimeoutError):
        return _flat(str(exc)) or "timed out"
    names = {cls.__module__.split(".")[0] + "." + cls.__name__ for cls in type(exc).__mro__}
    if names & {"sqlalchemy.OperationalError", "sqlalchemy.ProgrammingError"}:
        return _database(exc)
    if "httpx.TransportError" in names:
        return _no_answer(exc)
    return f"{type(exc).__name__}: {_flat(str(exc))}{DEBUG_HINT}"


def _no_answer(exc: BaseException) -> str:
    """An API that did not answer, named by the URL tried, with where that URL came from."""
    try:
        url = exc.request.url  # type: ignore[attr-defined]
        where = f" at {url.scheme}://{url.netloc.decode()} ({exc.request.method} {url.path}: "  # type: ignore[attr-defined]
    except RuntimeError:  # an error raised before any request was made
        where = " ("
    return (f"cannot reach the API{where}{type(exc).__name__}): start it with `yue2 api`; the CLI calls "
            f"YUE2_API_HOST:YUE2_API_PORT, where `yue2 api` listens, unless --api-url or YUE2_API_URL says otherwise")


def _database(exc: BaseException) -> str:
    from yue2_jobs.db.session import NO_SCHEMA, is_missing_schema

    if is_missing_schema(exc):
        return NO_SCHEMA
    orig = getattr(exc, "orig", exc)
    return (f"database error ({type(orig).__name__}): {_flat(str(orig))[:300]}; is the database running and "
            f"YUE2_DATABASE_URL right?")


def _flat(text: str) -> str:
    return " ".join(text.split())
