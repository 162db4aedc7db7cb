"""The YuE2 architecture: one config (`configuration_yue2.py`), one model file (`modeling_yue2.py`,
which registers `yue2` with the transformers Auto classes when it is imported), its tokenizer,
checkpoints with their manifest, and the BART converter. Decoding lives in `yue2_jobs.decode`,
training in `yue2_jobs.training`; this package imports neither.

Importing this package is light (no torch). The names below load their modules on first use, so
`from yue2_jobs.model import Yue2ForConditionalGeneration` registers the Auto classes too.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Yue2Config": "configuration_yue2", "PRESETS": "configuration_yue2",
    "Yue2ForConditionalGeneration": "modeling_yue2",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _LAZY[name] == "configuration_yue2":  # a config is only useful with its model: register both
        importlib.import_module(f"{__name__}.modeling_yue2")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
