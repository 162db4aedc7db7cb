"""Which device and dtype a model runs on (`YUE2_DEVICE`, `YUE2_DTYPE`, `yue2 train --device`)."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """`auto`: CUDA when there is one, else the CPU; any other name as torch spells it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` is bfloat16 on CUDA (half the bytes per step) and float32 on the CPU, where this
    machine's bf16 matrix-vector products measured no faster. `hybrid` equals `ar` greedy within
    one dtype, not across dtypes."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype)
    return dtype
