"""`hybrid` at a real model's cost: the shipped checkpoints grown to BART sizes, against `ar` and CTranslate2.

The shipped checkpoints are tiny (d_model 192), so a decoder step there is bound by operator
dispatch and says nothing about what drafting buys a real model. Here each is widened without
changing what it computes (`yue2_jobs.model.grow`): to BART-base's width (768 = 4 x 192, feed-forward
3,072) and to about BART-large's (1,152 = 6 x 192, feed-forward 4,608), with BART's 50,265-id
vocabulary (the new ids masked out) and an untied output projection. The grown model decodes the
shipped model's tokens (checked on every eval text below; a row may differ only where the shipped
model's top two processed logits tie within float rounding: counted and reported), so its drafts
are the real drafts and tau is real, while every matrix a step reads has a BART's size. Depth is
kept (2 encoder + 2 decoder layers; BART-base has 6 + 6): a post-LN layer cannot be added as an
exact identity. So a grown step reads the weights of a 2-layer BART with BART's vocabulary: at
768 wide that is 55 M multiply-adds per token, 62 % of BART-base's 88 M (the vocabulary is 38.6 M of
either), and the NAR pass (one layer and the draft vocabulary) costs about what it would there.

Engines, on the same weights and inputs (`peers.py`'s): ours `ar` and `hybrid` in fp32 and int8,
CTranslate2 fp32 and int8 (the grown model exported to BART), each with the checkpoint's repetition
controls; batch 1 and 8 over `--texts` eval texts. Printed: a table per (checkpoint, width, batch)
and a summary of the ratios the issue asks for; JSON to `--out`.

    python benchmarks/grown.py [--checkpoints base legal] [--widths 768 1152] [--batch-sizes 1 8]
"""

from __future__ import annotations

import json
import platform
import tempfile
from pathlib import Path
from typing import Any

import peers
import torch
from bench_args import ROOT, apply_common_arguments, parser_with_common_arguments

from yue2_jobs.decode.sampling import SamplingParams, repetition_controls
from yue2_jobs.decode.session import DecodeSession
from yue2_jobs.model.checkpoint import load_checkpoint
from yue2_jobs.model.grow import grow
from yue2_jobs.model.modeling_yue2 import Yue2ForConditionalGeneration
from yue2_jobs.training.data import read_split

VOCAB = 50265  # BART's
TIE_TOLERANCE = 1e-3  # a top-two gap under this (in processed logits) is a tie float rounding may turn


@torch.inference_mode()
def top_two_gap(model: Yue2ForConditionalGeneration, batch: dict[str, torch.Tensor], row: int,
                prefix: list[int]) -> float:
    """The gap between the top two processed logits (repetition controls applied) of `model` for the
    token after `prefix` (generated tokens, start token excluded) in `row` of `batch`."""
    cfg = model.config
    ids, mask = batch["input_ids"][row : row + 1], batch["attention_mask"][row : row + 1]
    seq = torch.tensor([[cfg.decoder_start_token_id, *prefix]])
    logits = model.lm_logits(model.decode(seq, model.encode(ids, mask))[:, -1:])  # (1, 1, V)
    params = SamplingParams.greedy(model.generation_config)
    if params.controls_repetition:
        logits = repetition_controls(logits, seq, torch.tensor([[seq.shape[1]]]), params)
    top = logits[0, 0].float().topk(2).values
    return float(top[0] - top[1])


def same_tokens(small: Yue2ForConditionalGeneration, grown: Yue2ForConditionalGeneration,
                batches: list[dict[str, torch.Tensor]], max_new_tokens: int) -> dict[str, Any]:
    """Greedy `ar` of the shipped and the grown model on every batch: rows that differ, and whether
    each difference starts at a near-tie of the shipped model."""
    a, b = DecodeSession(small), DecodeSession(grown)
    pad, eos = small.config.pad_token_id, small.config.eos_token_id
    rows = differ = ties = 0
    gaps = []
    for batch in batches:
        x = peers.generated(a.generate(batch["input_ids"], batch["attention_mask"], mode="ar",
                                        max_new_tokens=max_new_tokens).sequences, pad=pad, eos=eos)
        y = peers.generated(b.generate(batch["input_ids"], batch["attention_mask"], mode="ar",
                                        max_new_tokens=max_new_tokens).sequences, pad=pad, eos=eos)
        for i, (p, q) in enumerate(zip(x, y, strict=True)):
            rows += 1
            if p == q:
                continue
            differ += 1
            at = next(j for j in range(min(len(p), len(q))) if p[j] != q[j])
            gap = top_two_gap(small, batch, i, p[:at])
            gaps.append(gap)
            ties += gap < TIE_TOLERANCE
    if differ != ties:
        raise AssertionError(f"the grown model decodes {differ - ties} of {rows} rows differently where the "
                             f"shipped model has no near-tie (top-two gaps {gaps})")
    return {"rows": rows, "rows_differing": differ, "of_which_near_ties": ties, "gaps": gaps}


def padded_tokenizer(tokenizer: Any, size: int) -> Any:
    """A copy of `tokenizer` with placeholder tokens up to `size` ids: CTranslate2 wants one name per
    vocabulary row, and the grown rows have none (no text ever tokenizes to them)."""
    import copy

    out = copy.deepcopy(tokenizer)
    out.add_tokens([f"<grown_{i}>" for i in range(len(out), size)])
    assert len(out) == size
    return out


def _batches(tokenizer: Any, texts: list[str], bs: int) -> list[dict[str, torch.Tensor]]:
    return [dict(tokenizer(texts[i : i + bs], truncation=True, max_length=256, padding=True, return_tensors="pt"))
            for i in range(0, len(texts), bs)]


def run(name: str, width: int, args: Any, workdir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    small, tokenizer = load_checkpoint(ROOT / "checkpoints" / name)
    model = grow(small, d_model=width, ffn_dim=4 * width, vocab_size=args.vocab)
    what = f"{name} grown to {width}"
    data = read_split(ROOT / "data", "general" if name == "base" else name, "eval")[: args.texts]
    texts, refs = [r["text"] for r in data], [r["summary"] for r in data]
    check = same_tokens(small, model, _batches(tokenizer, texts, 16), args.max_new_tokens)
    print(f"{what}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters; greedy tokens as the "
          f"shipped model's on {check['rows'] - check['rows_differing']} of {check['rows']} texts "
          f"({check['of_which_near_ties']} differ, each at a near-tie)", flush=True)
    engines = peers.engines_for(model, padded_tokenizer(tokenizer, args.vocab), workdir / f"{name}-{width}",
                                peers.probe_of(tokenizer, texts[0]), max_new_tokens=args.max_new_tokens,
                                min_accept_prob=0.05, controls=peers.controls_of(model), dtypes=tuple(args.dtypes))
    rows = []
    for bs in args.batch_sizes:
        peers.measure(engines, _batches(tokenizer, texts, bs), args.repeats)
        rows += peers.report(engines, batch=bs, what=what, refs=refs, tokenizer=tokenizer)
        peers.print_rows(rows[-len(engines):])
    return rows, {"checkpoint": name, "width": width, "ffn": 4 * width, "vocab": args.vocab,
                  "encoder_layers": model.config.encoder_layers, "decoder_layers": model.config.decoder_layers,
                  "parameters": sum(p.numel() for p in model.parameters()), "same_tokens": check}


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (model, batch): `hybrid` / `ar` in fp32 and int8, and ours int8 against CTranslate2 int8."""
    out = []
    for what, batch in sorted({(r["what"], r["batch"]) for r in rows}):
        by = {r["engine"].split(" (")[0]: r for r in rows if r["what"] == what and r["batch"] == batch}
        line: dict[str, Any] = {"what": what, "batch": batch,
                                "tau": next(r["tau"] for n, r in by.items() if n.startswith("ours hybrid"))}
        for dtype in ("float32", "int8"):
            if f"ours ar {dtype}" not in by:
                continue
            line[f"hybrid_vs_ar_{dtype}"] = by[f"ours hybrid {dtype}"]["tok_s"] / by[f"ours ar {dtype}"]["tok_s"]
            ct = by.get(f"CTranslate2 {dtype}")
            if ct is not None:
                line[f"hybrid_vs_ct2_{dtype}"] = by[f"ours hybrid {dtype}"]["tok_s"] / ct["tok_s"]
                line[f"ar_vs_ct2_{dtype}"] = by[f"ours ar {dtype}"]["tok_s"] / ct["tok_s"]
        out.append(line)
    cols = [("model", "what"), ("batch", "batch"), ("tau", "tau"), ("hybrid/ar fp32", "hybrid_vs_ar_float32"),
            ("hybrid/ar int8", "hybrid_vs_ar_int8"), ("hybrid/CT2 fp32", "hybrid_vs_ct2_float32"),
            ("hybrid int8/CT2 int8", "hybrid_vs_ct2_int8"), ("ar int8/CT2 int8", "ar_vs_ct2_int8")]
    print("\n| " + " | ".join(c for c, _ in cols) + " |\n|" + "|".join("---" for _ in cols) + "|")
    for line in out:
        cells = [str(line[k]) if isinstance(line.get(k), (str, int)) else
                 (f"{line[k]:.2f}" + ("" if k == "tau" else "x") if line.get(k) is not None else "-") for _, k in cols]
        print("| " + " | ".join(cells) + " |")
    return out


def main() -> None:
    parser = parser_with_common_arguments(__doc__, out_name="grown.json", texts_default=48,
                                          texts_help="eval texts per checkpoint")
    parser.set_defaults(batch_sizes=[1, 8])
    parser.add_argument("--checkpoints", nargs="*", default=["base", "legal"])
    parser.add_argument("--widths", type=int, nargs="*", default=[768, 1152], help="d_model, multiples of 192")
    parser.add_argument("--vocab", type=int, default=VOCAB, help="vocabulary of the grown model (BART's)")
    parser.add_argument("--dtypes", nargs="*", default=["float32", "int8"], choices=["float32", "int8"],
                        help="weights of both engines (ours and CTranslate2)")
    args = parser.parse_args()
    apply_common_arguments(args)
    rows, models = [], []
    with tempfile.TemporaryDirectory(prefix="yue2-grown-") as tmp:
        for width in args.widths:
            for name in args.checkpoints:
                got, meta = run(name, width, args, Path(tmp))
                rows += got
                models.append(meta)
    lines = summary(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
            "python": platform.python_version(), "repeats": args.repeats, "texts": args.texts,
            "median_of": "repeats"}
    out.write_text(json.dumps({"meta": meta, "models": models, "summary": lines, "rows": rows}, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
