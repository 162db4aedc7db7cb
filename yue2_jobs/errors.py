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


class DataError(Yue2Error):
    """Raised when a corpus cannot be built or read (missing source package, empty split, bad line)."""
