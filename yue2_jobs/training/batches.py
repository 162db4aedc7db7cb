"""Training batches: token pairs, padding, a resumable batch order, the denoising mix."""

from __future__ import annotations

import random

import torch
from transformers import PreTrainedTokenizerBase

from yue2_jobs.model.configuration_yue2 import Yue2Config


def encode_pairs(tokenizer: PreTrainedTokenizerBase, rows: list[dict[str, str]], *, max_source_tokens: int,
                 max_target_tokens: int) -> list[tuple[list[int], list[int]]]:
    """(input ids, summary ids) of each row, each cut to its limit."""
    src = tokenizer([r["text"] for r in rows], truncation=True, max_length=max_source_tokens)["input_ids"]
    tgt = tokenizer([r["summary"] for r in rows], truncation=True, max_length=max_target_tokens)["input_ids"]
    return list(zip(src, tgt, strict=True))


def collate(pairs: list[tuple[list[int], list[int]]], pad: int, device: torch.device) -> dict[str, torch.Tensor]:
    s_len, t_len = max(len(s) for s, _ in pairs), max(len(t) for _, t in pairs)
    ids = torch.full((len(pairs), s_len), pad, dtype=torch.long)
    labels = torch.full((len(pairs), t_len), -100, dtype=torch.long)
    for i, (s, t) in enumerate(pairs):
        ids[i, : len(s)] = torch.tensor(s)
        labels[i, : len(t)] = torch.tensor(t)
    return {"input_ids": ids.to(device), "attention_mask": ids.ne(pad).to(device), "labels": labels.to(device)}


def batch_for_step(lengths: list[int], step: int, batch_size: int, seed: int) -> list[int]:
    """Indices of the batch at `step`, a function of (seed, step) alone, so resuming is exact.

    Each epoch is a seeded permutation cut into pools of 32 batches; a pool is sorted by
    input length before it is cut, and the epoch's batches are then shuffled, so a batch
    holds inputs of similar length and pads little, which makes steps much faster.
    """
    per_epoch = max(1, len(lengths) // batch_size)
    epoch, k = divmod(step, per_epoch)
    order = list(range(len(lengths)))
    rng = random.Random(seed * 1_000_003 + epoch)
    rng.shuffle(order)
    pool = 32 * batch_size
    batches = []
    for start in range(0, per_epoch * batch_size, pool):
        chunk = sorted(order[start : min(start + pool, per_epoch * batch_size)], key=lengths.__getitem__)
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches[k]


def mixed_batch(pairs: list[tuple[list[int], list[int]]], denoising: list[tuple[list[int], list[int]]],
                 indices: list[int], *, share: float, seed: int, step: int) -> list[tuple[list[int], list[int]]]:
    """The AR stage's batch: each item is its denoising twin with probability `share`."""
    rng = random.Random(seed * 1_000_033 + step)
    return [denoising[i] if rng.random() < share else pairs[i] for i in indices]


def denoising_pairs(pairs: list[tuple[list[int], list[int]]], config: Yue2Config, *, seed: int,
                    max_target_tokens: int) -> list[tuple[list[int], list[int]]]:
    """Reconstruct the opening of each input from a copy with 15% of its tokens masked.

    A tiny model trained on summaries alone learns the target-side language prior and barely
    reads the encoder; reconstruction first teaches cross-attention to find and copy input
    tokens, which summarisation then builds on (BART's denoising pretraining, in miniature).
    """
    rng = random.Random(seed)
    special = {config.bos_token_id, config.eos_token_id, config.pad_token_id}
    out = []
    for src, _ in pairs:
        noisy = [config.unk_token_id if t not in special and rng.random() < 0.15 else t for t in src]
        target = src[: max_target_tokens - 1]
        out.append((noisy, target if target[-1] == config.eos_token_id else [*target, config.eos_token_id]))
    return out
