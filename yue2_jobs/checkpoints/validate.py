"""Validation of a published version before it may serve, on by default for every variant.

1. every file's sha256 and size against the manifest, and no pickle weights (`verify_checkpoint_dir`);
2. it loads through the `transformers` Auto classes, and every weight is finite;
3. a fixed prompt set gives finite logits;
4. against the version it would replace (`gates.py`, `Gate`): the same tokenizer (unless the publish
   said `--tokenizer-change`); outputs that are not empty, unreadable or loops; and, on a canary
   set drawn from the variant's recent jobs, outputs close to the serving version's (unless the
   publish said `--expect-change`: then ROUGE-L on the variant's eval set may not fall by more
   than `YUE2_VALIDATION_MAX_ROUGE_DROP`);
5. optionally (`RougeGate`, from `YUE2_VALIDATION_MIN_ROUGE_L`), ROUGE-L on a few eval items is at
   least a minimum.

A version that fails never serves; its row says why (`yue2 checkpoints list`).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from sqlalchemy import select
from sqlalchemy.orm import Session

from yue2_jobs.checkpoints import gates
from yue2_jobs.checkpoints.gates import Thresholds, tokenizer_difference
from yue2_jobs.checkpoints.registry import active, finish_validation, start_validation, version_prefix
from yue2_jobs.db.models import CheckpointVersion, Job, JobStatus
from yue2_jobs.decode.params import DecodingParams
from yue2_jobs.decode.session import DecodeSession
from yue2_jobs.errors import CheckpointError, CheckpointFileMissingError, CheckpointSmokeTestError
from yue2_jobs.model.checkpoint import MANIFEST
from yue2_jobs.storage import Storage

SMOKE_PROMPTS = (
    "Return the number of rows in the table, counting only those whose status is active.",
    "The licensee may redistribute the software provided that this notice is retained in all copies.",
    "Close the connection pool and wait until every worker thread has exited.",
    "把所有文件按修改时间排序，然后返回最新的一个。",
)


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
    """A local copy of a version (fetched once; the directory appears only when complete: its
    manifest among its files, so a store that lacks the version leaves no empty copy behind)."""
    target = cache_dir / variant / version
    if (target / MANIFEST).is_file():
        return target
    prefix = version_prefix(variant, version)
    keys = store.list_keys(prefix)
    if prefix + MANIFEST not in keys:
        raise CheckpointFileMissingError(f"the checkpoint store has no {variant}@{version} (no {prefix}{MANIFEST}); "
                                         "is every host's YUE2_CHECKPOINT_STORE_URL the same store?",
                                         path=prefix + MANIFEST)
    shutil.rmtree(target, ignore_errors=True)  # a copy without its manifest (left by an older version of this code)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{version}-"))
    try:
        for key in keys:
            path = tmp / key[len(prefix):]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(store.get(key))
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


@dataclass(frozen=True)
class Gate:
    """What a candidate is judged against: the serving version (None: the variant has none, so
    only its own checks apply), inputs from the variant's recent jobs, the eval rows an expected
    change is scored on, and the thresholds."""

    serving_dir: Path | None
    serving_label: str
    canary: list[str]
    eval_rows: list[dict[str, str]]
    limits: Thresholds = field(default_factory=Thresholds)
    rouge_gate: RougeGate | None = None


def recent_inputs(session: Session, variant: str, *, limit: int) -> list[str]:
    """Distinct inline inputs of the variant's latest succeeded jobs (newest first)."""
    rows = session.execute(select(Job.input_text).where(
        Job.variant == variant, Job.status == JobStatus.SUCCEEDED, Job.input_text.is_not(None))
        .order_by(Job.finished_at.desc()).limit(limit * 4)).scalars()
    seen: dict[str, None] = {}
    for text in rows:
        if text and text.strip():
            seen.setdefault(text, None)
    return list(seen)[:limit]


def gate_for(session: Session, *, settings: Any, store: Storage, variant: str) -> Gate:
    """The gate a new version of `variant` must pass: against its active version (else the
    directory it starts from), on `validation_canary_items` inputs of its recent jobs, topped up
    from its eval set and the smoke prompts."""
    current = active(session, variant)
    serving_dir: Path | None
    if current is not None:
        serving_dir = download(store, variant=variant, version=current.version,
                               cache_dir=settings.resolved_checkpoint_cache_dir)
        label = f"{variant}@{current.version}"
    else:
        seed = settings.checkpoints.get(variant)
        serving_dir = Path(seed) if seed is not None and Path(seed).is_dir() else None
        label = f"{variant} ({seed})"
    n = settings.validation_canary_items
    canary = recent_inputs(session, variant, limit=n)
    eval_rows = _eval_rows(settings, variant)
    canary += [r["text"] for r in eval_rows if r["text"] not in canary][: max(0, n - len(canary))]
    canary += [p for p in SMOKE_PROMPTS if p not in canary][: max(0, n - len(canary))]
    return Gate(serving_dir=serving_dir, serving_label=label, canary=canary, eval_rows=eval_rows,
                limits=Thresholds.from_settings(settings), rouge_gate=RougeGate.for_variant(settings, variant))


def _eval_rows(settings: Any, variant: str) -> list[dict[str, str]]:
    """The first `validation_rouge_items` of the variant's eval set ([] when it has none)."""
    from yue2_jobs.core.paths import DATA
    from yue2_jobs.errors import DataError
    from yue2_jobs.training.data import read_split

    corpus = settings.validation_eval_sets.get(variant)
    if corpus is None:
        return []
    try:
        return read_split(DATA, corpus, "eval")[: settings.validation_rouge_items]
    except DataError:
        return []


@torch.inference_mode()
def validate_dir(directory: Path, *, gate: Gate | None = None, expect_change: bool = False,
                 tokenizer_change: bool = False) -> str:
    """Raise a CheckpointError naming what is wrong with the checkpoint in `directory`; else
    return the figures it passed with (one line)."""
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
    limits = gate.limits if gate is not None else Thresholds()
    inputs = gate.canary if gate is not None and gate.canary else list(SMOKE_PROMPTS)
    mine = gates.decode(session, inputs)
    figures = [f"{mine.degenerate_share:.0%} of {len(inputs)} outputs degenerate"]
    serving = None
    if gate is not None and gate.serving_dir is not None:
        try:
            serving = DecodeSession.load(gate.serving_dir, device="cpu", dtype="float32")
        except CheckpointError as exc:  # what serves is broken itself (the fix being published): judge alone
            figures.append(f"the serving version {gate.serving_label} does not load ({type(exc).__name__})")
    try:
        _judge(session, serving, gate, mine, inputs, limits, figures, expect_change=expect_change,
               tokenizer_change=tokenizer_change)
    except CheckpointSmokeTestError as exc:
        exc.path = str(directory)
        raise
    if gate is not None and gate.rouge_gate is not None:
        figures.append(f"ROUGE-L {gate.rouge_gate.check(session, directory):.2f} >= {gate.rouge_gate.minimum:.2f}")
    return "; ".join(figures)


def _judge(session: DecodeSession, serving: DecodeSession | None, gate: Gate | None, mine: gates.Decoded,
           inputs: list[str], limits: Thresholds, figures: list[str], *, expect_change: bool,
           tokenizer_change: bool) -> None:
    """The checks against the serving version (and the ones without it); appends what they measured."""
    assert session.tokenizer is not None
    if serving is None or gate is None:
        if mine.degenerate_share > limits.max_degenerate:
            raise CheckpointSmokeTestError(f"{mine.degenerate_share:.0%} of its outputs are degenerate, e.g. "
                                           f"{mine.first_reason()}")
        figures.append("no serving version to compare with")
        return
    assert serving.tokenizer is not None
    differs = tokenizer_difference(session.tokenizer, serving.tokenizer, inputs)
    if differs is not None and not tokenizer_change:
        raise CheckpointSmokeTestError(f"its tokenizer is not the serving version's ({gate.serving_label}): {differs}; "
                                       "publish with --tokenizer-change if that is intended")
    theirs = gates.decode(serving, inputs)
    if mine.degenerate_share > max(limits.max_degenerate, theirs.degenerate_share):
        raise CheckpointSmokeTestError(f"{mine.degenerate_share:.0%} of its outputs are degenerate (the serving "
                                       f"version's: {theirs.degenerate_share:.0%}), e.g. {mine.first_reason()}")
    if not expect_change:
        canary = gates.compare_on_canary(session, serving, inputs, serving_out=theirs, candidate_out=mine,
                                         limits=limits)
        figures.append(f"{canary.describe()} against {gate.serving_label}")
    elif gate.eval_rows:
        new, old = gates.eval_regression(session, serving, gate.eval_rows, limits=limits)
        figures.append(f"expected change: ROUGE-L {new:.2f} on {len(gate.eval_rows)} eval items "
                       f"(serving {gate.serving_label}: {old:.2f})")
    else:
        figures.append("expected change: the variant has no eval set to score it on")
    drafts = gates.check_drafter(session, serving, inputs, candidate_ar=mine, serving_ar=theirs, limits=limits,
                                 expect_change=expect_change)
    figures.append(f"drafter: hybrid_fast agrees {drafts[0]:.2f} with ar (serving {drafts[1]:.2f})")
    if differs is not None:
        figures.append(f"tokenizer changed: {differs}")


def validate_version(session: Session, row: CheckpointVersion, *, store: Storage, settings: Any) -> Path | None:
    """Validate a registered version against its variant's serving version (`gate_for`); its row
    ends validated or `failed` with the reason, and its figures in `report`. Returns its local
    directory when it passed."""
    start_validation(session, row)
    try:
        gate = gate_for(session, settings=settings, store=store, variant=row.variant)
        directory = download(store, variant=row.variant, version=row.version,
                             cache_dir=settings.resolved_checkpoint_cache_dir)
        report = validate_dir(directory, gate=gate, expect_change=row.expect_change,
                              tokenizer_change=row.tokenizer_change)
    except Exception as exc:
        finish_validation(session, row, error=f"{type(exc).__name__}: {_one_line(exc)}")
        return None
    finish_validation(session, row, error=None, report=report)
    return directory


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 500 else text[:497] + "..."
