"""The one error hierarchy of yue2-jobs.

Permanent errors (bad input, bad checkpoint) must not be retried; retryable ones may be.
Foreign errors are translated into these at the boundary that meets them.
"""

from __future__ import annotations


class Yue2Error(Exception):
    """Root of every error yue2-jobs raises on purpose."""

    retryable = False


class CheckpointError(Yue2Error):
    """Raised when a checkpoint directory cannot be used as it is."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class CheckpointFileMissingError(CheckpointError):
    """Raised when a file the checkpoint needs (or its manifest lists) is absent."""


class CheckpointCorruptError(CheckpointError):
    """Raised when a file's size or sha256 differs from the manifest, or the manifest is unreadable."""


class PickleWeightsRefusedError(CheckpointError):
    """Raised when a checkpoint holds pickle weights (.bin, .pt, ...), which can run code on load."""


class CheckpointSmokeTestError(CheckpointError):
    """Raised when a checkpoint loads but fails its smoke checks: non-finite weights or logits, empty outputs."""


class DataError(Yue2Error):
    """Raised when a corpus cannot be built or read (missing source package, empty split, bad line)."""


class PipelineError(Yue2Error):
    """Root of the errors of the job pipeline (API, storage, queue, workers)."""


class InvalidRequestError(PipelineError):
    """Raised when a request or job line breaks a rule; `field` names what, `status` is the HTTP code."""

    def __init__(self, message: str, *, field: str, status: int = 422, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.field, self.status, self.code = field, status, code


class LimitExceededError(InvalidRequestError):
    """Raised when a request is over an explicit limit; the message names the field and the limit."""

    def __init__(self, *, field: str, limit: int, actual: int, unit: str, status: int = 413,
                 at_least: bool = False) -> None:
        # `at_least`: `actual` is what was counted before stopping (a file is not read on past a limit)
        super().__init__(f"{field} is {'at least ' if at_least else ''}{actual:,} {unit}, over the limit of "
                         f"{limit:,} {unit}", field=field, status=status, code="limit_exceeded")
        self.limit, self.actual = limit, actual


class NotFoundError(PipelineError):
    """Raised when an id names nothing the caller's tenant owns (other tenants' ids included)."""


class AuthError(PipelineError):
    """Raised when a request carries no API key or one that is unknown or revoked."""


class ConflictError(PipelineError):
    """Raised when an action does not fit the object's state (cancelling a finished batch, say)."""


class TooManyRequestsError(PipelineError):
    """Raised when a tenant already has its limit of requests in flight (429, with Retry-After)."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServiceUnavailableError(PipelineError):
    """Raised when a dependency (the database, a connection pool) cannot serve now; the caller may retry (503)."""

    retryable = True


class StorageError(PipelineError):
    """Raised when the object store fails permanently (missing bucket, access denied, missing key).
    `summary`: the problem without names or paths, for an unauthenticated health check."""

    def __init__(self, message: str, *, summary: str = "storage error") -> None:
        super().__init__(message)
        self.summary = summary


class StorageUnavailableError(StorageError):
    """Raised when the object store cannot be reached or throttles; the operation may be retried."""

    retryable = True


class JobExecutionError(PipelineError):
    """Raised when one job cannot be run (unreadable input, decoding error); it fails alone."""


class WorkerGoneError(PipelineError):
    """Raised when a worker the watchdog is swapping stops reporting (it exited or died): it is skipped."""


class GlyphsMissingError(PipelineError):
    """Raised when no shipped font has a real glyph (a non-empty outline) for some characters of a render job."""

    def __init__(self, characters: list[str]) -> None:
        listed = ", ".join(f"U+{ord(c):04X} {c!r}" for c in characters[:50])
        more = f" and {len(characters) - 50} more" if len(characters) > 50 else ""
        super().__init__(f"no font has a glyph for {len(characters)} character(s): {listed}{more}")
        self.characters = characters
