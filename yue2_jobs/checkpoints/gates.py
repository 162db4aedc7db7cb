"""The checks that keep a broken checkpoint from serving, each judged against the version it would
replace (the serving one) where there is one:

- `tokenizer_difference`: a candidate must read and write text as the serving version does (the
  same vocabulary and special tokens), unless its publish said `--tokenizer-change`;
- `degenerate`: outputs that are empty, mostly U+FFFD replacement characters, one token over and
  over, or a short loop; a candidate fails when more of its outputs are degenerate than
  `Thresholds.max_degenerate` and than the serving version's;
- `check_drafter`: the draft branch, which no `ar` output shows, must work about as well as the
  serving version's (its `hybrid_fast` outputs against its own `ar` ones);
- `compare_on_canary`: on inputs drawn from the variant's recent jobs, the candidate's greedy
  outputs must agree with the serving version's (mean ROUGE-L F1 >= `min_agreement`) and its loss
  on the serving version's outputs must be close to the serving version's own (gap <=
  `max_loss_gap` nats per token), unless the publish said `--expect-change`;
- `eval_regression`: with `--expect-change`, ROUGE-L on the variant's eval set (with references)
  may fall at most `max_rouge_drop` points below the serving version's.

Everything here is pure measurement on two loaded `DecodeSession`s; `validate.py` runs the flow.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from yue2_jobs.decode.params import DecodingParams
from yue2_jobs.decode.session import DecodeSession
from yue2_jobs.errors import CheckpointSmokeTestError
from yue2_jobs.rouge import pair_scores, rouge
from yue2_jobs.training.batches import collate, encode_pairs

CANARY_NEW_TOKENS = 48
REPLACEMENT_SHARE = 0.3  # an output with more U+FFFD than this share of its characters is unreadable
ONE_TOKEN_SHARE = 0.6  # an output whose most common token is more than this share of its tokens
LOOP_MIN_TOKENS = 8  # outputs shorter than this are not judged for loops
LOOP_DISTINCT = 0.3  # distinct tokens / tokens under this: a short loop


@dataclass(frozen=True)
class Thresholds:
    """What a candidate must meet (from `YUE2_VALIDATION_*`; the defaults are the settings')."""

    min_agreement: float = 0.5
    max_loss_gap: float = 1.0
    max_degenerate: float = 0.25
    max_rouge_drop: float = 2.0
    max_draft_drop: float = 0.25

    @classmethod
    def from_settings(cls, settings: Any) -> Thresholds:
        return cls(min_agreement=settings.validation_min_agreement, max_loss_gap=settings.validation_max_loss_gap,
                   max_degenerate=settings.validation_max_degenerate,
                   max_rouge_drop=settings.validation_max_rouge_drop,
                   max_draft_drop=settings.validation_max_draft_drop)


def tokenizer_fingerprint(tokenizer: Any) -> dict[str, Any]:
    """What decides how text becomes ids and back: the vocabulary and the special tokens."""
    vocab = tokenizer.get_vocab()
    digest = hashlib.sha256(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode()).hexdigest()
    specials = {k: getattr(tokenizer, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id",
                                                         "unk_token_id")}
    return {"size": len(vocab), "vocab_sha256": digest, "specials": specials}


def tokenizer_difference(candidate: Any, serving: Any, texts: list[str]) -> str | None:
    """None when the two tokenizers map text to the same ids (the same vocabulary and special
    tokens, and the same ids for each of `texts`: merges and normalisation count too), else what
    differs (one phrase)."""
    a, b = tokenizer_fingerprint(candidate), tokenizer_fingerprint(serving)
    if a == b:
        for i, text in enumerate(texts):
            if candidate(text)["input_ids"] != serving(text)["input_ids"]:
                return f"the same vocabulary, but input {i} becomes other ids (other merges or normalisation)"
        return None
    if a["size"] != b["size"]:
        return f"a vocabulary of {a['size']} entries where the serving version's has {b['size']}"
    if a["vocab_sha256"] != b["vocab_sha256"]:
        va, vb = candidate.get_vocab(), serving.get_vocab()
        differ = sum(1 for tok, i in va.items() if vb.get(tok) != i)
        return f"{differ} of its {a['size']} vocabulary entries map to other ids than the serving version's"
    return f"other special tokens ({a['specials']} vs {b['specials']})"


def degenerate(text: str, token_ids: list[int]) -> str | None:
    """Why one output is garbage (None: it is not). `token_ids`: its generated ids, specials removed."""
    if not text.strip():
        return "empty"
    if text.count("\ufffd") > REPLACEMENT_SHARE * len(text):
        return "mostly replacement characters"
    if len(token_ids) >= 4 and Counter(token_ids).most_common(1)[0][1] > ONE_TOKEN_SHARE * len(token_ids):
        return "one token repeated"
    if len(token_ids) >= LOOP_MIN_TOKENS and len(set(token_ids)) < LOOP_DISTINCT * len(token_ids):
        return "a short loop"
    return None


@dataclass(frozen=True)
class Decoded:
    texts: list[str]
    reasons: list[str | None]  # each output's `degenerate` verdict

    @property
    def degenerate_share(self) -> float:
        return sum(r is not None for r in self.reasons) / max(1, len(self.reasons))

    def first_reason(self) -> str:
        return next((f"{r} (input {i})" for i, r in enumerate(self.reasons) if r), "")


@torch.inference_mode()
def decode(session: DecodeSession, texts: list[str], *, max_new_tokens: int = CANARY_NEW_TOKENS,
           mode: str = "ar") -> Decoded:
    """Greedy outputs of `texts` (`ar`; `hybrid_fast` to judge the drafter), and each one's
    degeneration verdict."""
    tokenizer = session.tokenizer
    assert tokenizer is not None
    special = set(tokenizer.all_special_ids)
    enc = tokenizer(texts, truncation=True, max_length=session.max_input_tokens, padding=True, return_tensors="pt")
    out = session.generate(enc["input_ids"], enc["attention_mask"], mode=mode, max_new_tokens=max_new_tokens)
    ids = [[t for t in row if t not in special] for row in out.sequences.tolist()]
    outputs = [t.strip() for t in tokenizer.batch_decode(out.sequences, skip_special_tokens=True)]
    return Decoded(outputs, [degenerate(t, i) for t, i in zip(outputs, ids, strict=True)])


@torch.inference_mode()
def loss_on(session: DecodeSession, inputs: list[str], targets: list[str]) -> float:
    """Mean per-token cross-entropy (nats) of `targets` given `inputs`, teacher-forced."""
    tokenizer = session.tokenizer
    assert tokenizer is not None
    pairs = encode_pairs(tokenizer, [{"text": i, "summary": t} for i, t in zip(inputs, targets, strict=True)],
                         max_source_tokens=session.max_input_tokens, max_target_tokens=CANARY_NEW_TOKENS + 2)
    batch = collate(pairs, session.model.config.pad_token_id, session.device)
    loss = session.model(**batch).loss
    return float(loss) if loss is not None else float("nan")


def agreement(outputs: list[str], references: list[str]) -> float:
    """Mean ROUGE-L F1 of `outputs` against `references` (an identical pair counts 1, even one
    with no word for ROUGE to see)."""
    scores = pair_scores(outputs, references)
    return sum(1.0 if o == r else s["rougeL"] for o, r, s in zip(outputs, references, scores, strict=True)) / max(
        1, len(outputs))


def check_drafter(candidate: DecodeSession, serving: DecodeSession, inputs: list[str], *, candidate_ar: Decoded,
                  serving_ar: Decoded, limits: Thresholds, expect_change: bool) -> tuple[float, float]:
    """The draft branch, which `ar` never runs: `hybrid_fast` commits its drafts unverified, so its
    outputs against the same model's `ar` ones tell a working drafter from a broken one (base's
    and legal's on their own inputs: 0.72-0.79; legal's on base's: 0.43; random draft weights:
    under 0.05). The candidate fails when it is both under `min_agreement` and more than
    `max_draft_drop` under the serving version's (a converted model's untrained drafter serves the
    same way before and after); with an expected change, which may well be another domain than the
    canary's, when it is more than `max_draft_drop` under `min_agreement`. Returns both."""
    mine = agreement(decode(candidate, inputs, mode="hybrid_fast").texts, candidate_ar.texts)
    theirs = agreement(decode(serving, inputs, mode="hybrid_fast").texts, serving_ar.texts)
    floor = limits.min_agreement - limits.max_draft_drop if expect_change else theirs - limits.max_draft_drop
    if mine < limits.min_agreement and mine < floor:
        raise CheckpointSmokeTestError(
            f"its drafter is broken: hybrid_fast outputs agree {mine:.2f} with its own ar outputs, the serving "
            f"version's {theirs:.2f} (needs >= {limits.min_agreement:.2f} or >= {floor:.2f})")
    return mine, theirs


@dataclass(frozen=True)
class Canary:
    items: int
    agreement: float  # mean ROUGE-L F1 of the candidate's outputs against the serving version's
    loss_gap: float  # candidate's loss on the serving outputs minus the serving version's own

    def describe(self) -> str:
        return f"canary {self.items} inputs: agreement {self.agreement:.2f}, loss gap {self.loss_gap:+.2f}"


def compare_on_canary(candidate: DecodeSession, serving: DecodeSession, inputs: list[str], *,
                      serving_out: Decoded, candidate_out: Decoded, limits: Thresholds) -> Canary:
    """Raise when the candidate strays from the serving version on `inputs`; else its figures."""
    agreed = agreement(candidate_out.texts, serving_out.texts)
    targets = [t if t else "." for t in serving_out.texts]  # an empty target would teach nothing
    gap = loss_on(candidate, inputs, targets) - loss_on(serving, inputs, targets)
    result = Canary(len(inputs), agreed, gap)
    if not (gap == gap) or agreed < limits.min_agreement or gap > limits.max_loss_gap:  # gap != gap: NaN
        raise CheckpointSmokeTestError(
            f"strays from the serving version: {result.describe()} (needs agreement >= {limits.min_agreement:.2f} "
            f"and loss gap <= {limits.max_loss_gap:.2f}); publish with --expect-change if it is meant to decode "
            "differently")
    return result


def eval_regression(candidate: DecodeSession, serving: DecodeSession, rows: list[dict[str, str]], *,
                    limits: Thresholds) -> tuple[float, float]:
    """(candidate, serving) ROUGE-L x 100 on eval `rows`; raise when the candidate falls too far."""
    refs = [r["summary"] for r in rows]
    params = DecodingParams(mode="ar")
    new = 100 * rouge(candidate.summarize([r["text"] for r in rows], params), refs).rougeL
    old = 100 * rouge(serving.summarize([r["text"] for r in rows], params), refs).rougeL
    if new < old - limits.max_rouge_drop:
        raise CheckpointSmokeTestError(f"ROUGE-L {new:.2f} on {len(rows)} eval items is {old - new:.2f} points under "
                                       f"the serving version's {old:.2f} (at most {limits.max_rouge_drop:.2f} allowed)")
    return new, old
