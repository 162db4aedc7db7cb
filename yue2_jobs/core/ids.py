"""Row ids: a type prefix (`job_`, `batch_`, `file-`, `exp_`, as OpenAI's ids look) and a random uuid."""

from __future__ import annotations

import uuid


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"
