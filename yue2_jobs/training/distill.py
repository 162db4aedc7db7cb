"""Self-distillation: a checkpoint's own `ar` outputs as its drafter's targets, and the draft
vocabulary built from them.

Verification accepts a draft only when it equals the token `ar` would choose, repetition controls
included, so the drafter learns those choices, not reference summaries: any inputs will do, no
labels needed. Decoding them is most of a drafter run's cost, so the outputs can be appended to a
cache file as they come (one JSON line per input) and a killed run picks up where it stopped.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from yue2_jobs.decode.session import DecodeSession
from yue2_jobs.model.modeling_yue2 import Yue2ForConditionalGeneration
from yue2_jobs.training.batches import collate
from yue2_jobs.training.draft_vocab import coverage_of, shortlist

Pairs = list[tuple[list[int], list[int]]]
DISTILL_BATCH = 64  # inputs decoded together (length-sorted, so they pad little)


def _read_cache(cache: Path | None) -> dict[int, list[int]]:
    """The outputs a cache file holds; a last line cut short by a kill is ignored."""
    done: dict[int, list[int]] = {}
    if cache is None or not cache.is_file():
        return done
    for line in cache.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        done[int(row["i"])] = [int(t) for t in row["tokens"]]
    return done


@torch.no_grad()
def ar_outputs(model: Yue2ForConditionalGeneration, sources: Sequence[list[int]], *, max_new_tokens: int,
               device: torch.device, desc: str, cache: Path | None = None) -> list[list[int]]:
    """Each source's greedy `ar` output (EOS included), decoded as the checkpoint's generation config
    says (its repetition controls too). With `cache`, outputs already there are not decoded again
    and new ones are appended batch by batch."""
    model.eval()
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    done = _read_cache(cache)
    todo = sorted((i for i in range(len(sources)) if i not in done), key=lambda i: len(sources[i]))
    session = DecodeSession(model)  # the weights change between runs: a session per distillation
    sink = cache.open("a") if cache is not None else None
    try:
        bar = tqdm(total=len(sources), initial=len(sources) - len(todo), desc=desc, unit="input",
                   mininterval=0.5 if sys.stderr.isatty() else 30.0)
        for start in range(0, len(todo), DISTILL_BATCH):
            idx = todo[start : start + DISTILL_BATCH]
            batch = collate([(sources[i], [eos]) for i in idx], pad, device)
            seqs = session.generate(batch["input_ids"], batch["attention_mask"], mode="ar",
                                    max_new_tokens=max_new_tokens).sequences[:, 1:].tolist()
            for i, seq in zip(idx, seqs, strict=True):
                done[i] = seq[: seq.index(eos) + 1] if eos in seq else seq
                if sink is not None:
                    sink.write(json.dumps({"i": i, "tokens": done[i]}) + "\n")
            if sink is not None:
                sink.flush()
            bar.update(len(idx))
        bar.close()
    finally:
        if sink is not None:
            sink.close()
    return [done[i] for i in range(len(sources))]


def distilled_pairs(model: Yue2ForConditionalGeneration, sources: Sequence[list[int]], *, max_new_tokens: int,
                    device: torch.device, desc: str, cache: Path | None = None) -> Pairs:
    """(source, the checkpoint's own output) for each source."""
    outputs = ar_outputs(model, sources, max_new_tokens=max_new_tokens, device=device, desc=desc, cache=cache)
    return [(list(src), out) for src, out in zip(sources, outputs, strict=True)]


def build_draft_vocab(model: Yue2ForConditionalGeneration, distilled: Pairs, *, coverage: float) -> str:
    """Restrict the drafter to the ids that cover `coverage` of the distilled outputs' tokens (0: every
    id); returns a line saying what was chosen."""
    targets = [tgt for _, tgt in distilled]
    if not coverage:
        model.set_draft_vocab(None)
        return f"draft vocabulary: all {model.config.vocab_size} ids"
    ids = shortlist(targets, coverage=coverage, always=[model.config.eos_token_id])
    model.set_draft_vocab(ids)
    return (f"draft vocabulary: {len(ids)} of {model.config.vocab_size} ids, covering "
            f"{coverage_of(ids, targets):.3f} of the AR branch's output tokens")
