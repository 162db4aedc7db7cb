"""Validation of a published version before it may serve: its files, its weights, a smoke run.

1. every file's sha256 and size against the manifest, and no pickle weights (`verify_checkpoint_dir`);
2. it loads through the `transformers` Auto classes, and every weight is finite;
3. a fixed prompt set decodes: the logits of the first step are finite and every output is non-empty;
4. optionally (`RougeGate`, from `YUE2_VALIDATION_MIN_ROUGE_L`), ROUGE-L on a few eval items is at
   least a minimum: a version that decodes but has forgotten its task does not go live.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from sqlalchemy.orm import Session

from yue2_jobs.checkpoints.registry import finish_validation, start_validation, version_prefix
from yue2_jobs.db.models import CheckpointVersion
from yue2_jobs.errors import CheckpointSmokeTestError
from yue2_jobs.decode.params import DecodingParams
from yue2_jobs.decode.session import DecodeSession
from yue2_jobs.storage import Storage

SMOKE_PROMPTS = (
    "Return the number of rows in the table, counting only those whose status is active.",
    "The licensee may redistribute the software provided that this notice is retained in all copies.",
    "Close the connection pool and wait until every worker thread has exited.",
    "把所有文件按修改时间排序，然后返回最新的一个。",
)
SMOKE_NEW_TOKENS = 16


@dataclass(frozen=True)
class RougeGate:
    """Validation fails when ROUGE-L F1 x 100 on the first `items` of `corpus`'s eval split is under `minimum`."""

    corpus: str
    minimum: float
    items: int = 16

    @classmethod
    def for_variant(cls, settings: Any, variant: str) -> RougeGate | None:
        if variant not in settings.validation_min_rouge_l:
            return None
        return cls(corpus=settings.validation_eval_sets.get(variant, variant),
                   minimum=settings.validation_min_rouge_l[variant], items=settings.validation_rouge_items)

    def check(self, session: DecodeSession, directory: Path) -> float:
        from yue2_jobs.core.paths import DATA
        from yue2_jobs.training.data import read_split
        from yue2_jobs.training.evaluate import rouge

        rows = read_split(DATA, self.corpus, "eval")[: self.items]
        preds = session.summarize([r["text"] for r in rows], DecodingParams(mode="ar"))
        score = 100 * rouge(preds, [r["summary"] for r in rows]).rougeL
        if score < self.minimum:
            raise CheckpointSmokeTestError(f"ROUGE-L {score:.2f} on {len(rows)} {self.corpus} eval items is under "
                                           f"the minimum {self.minimum:.2f}", path=str(directory))
        return score


def download(store: Storage, *, variant: str, version: str, cache_dir: Path) -> Path:
    """A local copy of a version (fetched once; the directory appears only when complete)."""
    target = cache_dir / variant / version
    if target.is_dir():
        return target
    prefix = version_prefix(variant, version)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{version}-"))
    try:
        for key in store.list_keys(prefix):
            path = tmp / key[len(prefix):]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(store.get(key))
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


@torch.inference_mode()
def validate_dir(directory: Path, *, rouge_gate: RougeGate | None = None) -> None:
    """Raise a CheckpointError naming what is wrong with the checkpoint in `directory`."""
    session = DecodeSession.load(directory, device="cpu", dtype="float32")  # verifies every file first
    model, tokenizer = session.model, session.tokenizer
    assert tokenizer is not None
    for name, weight in model.state_dict().items():
        if weight.is_floating_point() and not bool(torch.isfinite(weight).all()):
            raise CheckpointSmokeTestError(f"weight {name} holds NaN or Inf values", path=str(directory))
    enc = tokenizer(list(SMOKE_PROMPTS), truncation=True, max_length=128, padding=True, return_tensors="pt")
    start = torch.full((len(SMOKE_PROMPTS), 1), model.config.decoder_start_token_id)
    logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], decoder_input_ids=start).logits
    if not bool(torch.isfinite(logits).all()):
        raise CheckpointSmokeTestError("the smoke prompts give NaN or Inf logits", path=str(directory))
    out = session.generate(enc["input_ids"], enc["attention_mask"], mode="ar", max_new_tokens=SMOKE_NEW_TOKENS)
    for i, text in enumerate(tokenizer.batch_decode(out.sequences, skip_special_tokens=True)):
        if not text.strip():
            raise CheckpointSmokeTestError(f"smoke prompt {i} decodes to an empty output", path=str(directory))
    if rouge_gate is not None:
        rouge_gate.check(session, directory)


def validate_version(session: Session, row: CheckpointVersion, *, store: Storage, cache_dir: Path,
                     rouge_gate: RougeGate | None = None) -> Path | None:
    """Validate a registered version; its row ends validated or `failed` with the reason.
    Returns its local directory when it passed."""
    start_validation(session, row)
    try:
        directory = download(store, variant=row.variant, version=row.version, cache_dir=cache_dir)
        validate_dir(directory, rouge_gate=rouge_gate)
    except Exception as exc:
        finish_validation(session, row, error=f"{type(exc).__name__}: {exc}")
        return None
    finish_validation(session, row, error=None)
    return directory
