"""The shipped base checkpoint, loaded once per test session and shared by every test that
decodes with it (none may change it: each treats it as read-only)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@cache
def shipped_base() -> tuple[Any, Any]:
    """(model, tokenizer) of checkpoints/base."""
    from yue2_jobs.model.checkpoint import load_checkpoint

    return load_checkpoint(ROOT / "checkpoints" / "base")
