"""Our decoder against CTranslate2, the engine a CPU user picks today: at real sizes and on the
shipped checkpoints, float32 and int8, same tokens checked.

1. Random weights in BART-base and -large shapes (50,265-token word-level vocabulary, 128-token
   sources, 64 new tokens, EOS banned through `final_logits_bias` so every engine decodes the same
   length). Both engines load the same fp32 weights (ours exported to BART and converted by
   CTranslate2's own converter). Rows: tok/s end to end (encoder included) of our `ar` and `hybrid`
   and of CTranslate2 float32 and int8 (1 thread and as many as torch uses, each an engine; the
   "vs CT2" ratios take the faster at each batch size); ms per decoder step; the `hybrid` step in `ar` steps
   (random weights draft nothing useful, so `hybrid` verifies K drafts every step and commits one
   token: the step's cost, not its payoff); and token agreement: `hybrid` with our `ar` in the same
   dtype (a note is printed where a near-tie flipped), CTranslate2 with our `ar` in its dtype.
2. The shipped checkpoints on their eval sets: the same engines with the checkpoint's repetition
   controls; tau (tokens per decoder step), exact match with our `ar` in the same dtype, ROUGE-L.

Ours runs eagerly and, where this machine can build it, with the compiled CPU step
(`decode/compiled.py`: rows "... compiled", their "step in ar steps" in compiled `ar` steps, "same
as eager" their token agreement with the eager engine; the build time, cached after, is printed).

Every repeat runs every engine once, in rotated order; medians are reported, and the ratios are the
figures to read (the machines are noisy).

    python benchmarks/peers.py [--shapes base large] [--batch-sizes 1 8] [--checkpoints base legal]
"""

from __future__ import annotations

import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ct2
import torch
from bench_args import ROOT, apply_common_arguments, parser_with_common_arguments
from step_cost import SHAPES
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from yue2_jobs.decode.session import DecodeSession
from yue2_jobs.model import Yue2Config, Yue2ForConditionalGeneration
from yue2_jobs.model.checkpoint import load_checkpoint
from yue2_jobs.model.convert import bart_from_yue2
from yue2_jobs.training.data import read_split
from yue2_jobs.training.evaluate import rouge

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]


@dataclass
class Engine:
    name: str
    # -> generated ids, decoder steps of the batch, rows' decoder steps summed, NAR tokens, drafts verified
    run: Callable[[dict[str, torch.Tensor]], tuple[list[list[int]], int, int, int, int]]
    dtype: str
    ours: bool = True
    outputs: list[list[int]] = field(default_factory=list)
    steps: int = 0
    row_steps: int = 0
    nar: int = 0
    drafted: int = 0
    seconds: list[float] = field(default_factory=list)
    compile: dict[str, Any] | None = None  # the compiled step's build (or load) time and row limit


def word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word-level vocabulary of `vocab_size` tokens (CTranslate2 needs token strings)."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS)} | {f"w{i}": i for i in range(len(SPECIALS), vocab_size)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
                                   bos_token="<s>", pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def random_model(shape: str, *, draft_vocab: int, seed: int = 0) -> Yue2ForConditionalGeneration:
    """Random weights in a BART shape that never emit EOS (so every engine decodes the same length)."""
    torch.manual_seed(seed)
    model = Yue2ForConditionalGeneration(Yue2Config(**SHAPES[shape], max_position_embeddings=1024, nar_layers=1,
                                                    nar_block_size=4)).eval()
    with torch.no_grad():
        model.final_logits_bias[0, model.config.eos_token_id] = -1e4
    model.generation_config.forced_eos_token_id = None
    if draft_vocab:  # a real checkpoint's shortlist covers 97 % of its outputs with a fraction of the ids
        model.set_draft_vocab(torch.randperm(model.config.vocab_size)[:draft_vocab])
    return model


def ours(session: DecodeSession, name: str, mode: str, *, max_new_tokens: int, min_accept_prob: float) -> Engine:
    eos = session.model.config.eos_token_id

    def run(b: dict[str, torch.Tensor]) -> tuple[list[list[int]], int, int, int, int]:
        out = session.generate(b["input_ids"], b["attention_mask"], mode=mode, max_new_tokens=max_new_tokens,
                               min_accept_prob=min_accept_prob)
        return (generated(out.sequences, pad=session.model.config.pad_token_id, eos=eos),
                max(s.decoder_steps for s in out.stats), sum(s.decoder_steps for s in out.stats),
                sum(s.nar_tokens for s in out.stats), sum(s.drafted_tokens for s in out.stats))

    return Engine(name, run, session.precision)


def peer(translator: Any, tokenizer: Any, name: str, dtype: str, *, max_new_tokens: int, forced_eos: int | None,
         **options: Any) -> Engine:
    def run(b: dict[str, torch.Tensor]) -> tuple[list[list[int]], int, int, int, int]:
        rows = ct2.decode_ids(translator, tokenizer, b["input_ids"], b["attention_mask"],
                              max_new_tokens=max_new_tokens, **options)
        if forced_eos is not None:  # the checkpoint's forced_eos_token_id, which CTranslate2 does not apply
            rows = [[*r[:-1], forced_eos] if len(r) == max_new_tokens and r[-1] != forced_eos else r for r in rows]
        return rows, max(len(r) for r in rows), sum(len(r) for r in rows), 0, 0

    return Engine(name, run, dtype, ours=False)


def generated(seqs: torch.Tensor, *, pad: int, eos: int) -> list[list[int]]:
    out = []
    for row in seqs[:, 1:].tolist():
        row = [t for t in row if t != pad]
        out.append(row[: row.index(eos) + 1] if eos in row else row)
    return out


def measure(engines: list[Engine], batches: list[dict[str, torch.Tensor]], repeats: int) -> None:
    """A warm-up run that keeps each engine's outputs and steps, then `repeats` timed rotations."""
    for e in engines:
        e.outputs, e.steps, e.row_steps, e.nar, e.drafted, e.seconds = [], 0, 0, 0, 0, []
        for b in batches:
            out, steps, row_steps, nar, drafted = e.run(b)
            e.outputs += out
            e.steps += steps
            e.row_steps += row_steps
            e.nar += nar
            e.drafted += drafted
    for r in range(repeats):
        for e in engines[r % len(engines):] + engines[: r % len(engines)]:
            t0 = time.perf_counter()
            for b in batches:
                e.run(b)
            e.seconds.append(time.perf_counter() - t0)


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of positions where two engines chose the same token (over the shorter of each pair)."""
    same = total = 0
    for x, y in zip(a, b, strict=True):
        n = min(len(x), len(y))
        same += sum(p == q for p, q in zip(x[:n], y[:n], strict=True))
        total += max(len(x), len(y))
    return same / total if total else 1.0


def engines_for(model: Yue2ForConditionalGeneration, tokenizer: Any, workdir: Path, probe: list[list[str]], *,
             max_new_tokens: int, min_accept_prob: float, controls: dict[str, Any],
             dtypes: tuple[str, ...] = ("float32", "int8")) -> list[Engine]:
    engines = []
    for dtype in dtypes:
        session = DecodeSession(model, dtype=dtype)
        for mode in ("ar", "hybrid"):
            engines.append(ours(session, f"ours {mode} {dtype}", mode, max_new_tokens=max_new_tokens,
                                min_accept_prob=min_accept_prob))
    if "float32" in dtypes:  # the compiled CPU step (decode/compiled.py), where this machine can build it
        session = DecodeSession(model, dtype="float32")
        start = time.perf_counter()
        built = session.compile_steps()
        if built is not None:
            seconds = time.perf_counter() - start
            limits = {s.drafts: n for s, n in built.max_rows.items()}
            print(f"compiled step: {seconds:.1f} s ({'built ' + str(len(built.built)) if built.built else 'cached'};"
                  f" row limits {limits})")
            for mode in ("ar", "hybrid"):
                e = ours(session, f"ours {mode} float32 compiled", mode, max_new_tokens=max_new_tokens,
                         min_accept_prob=min_accept_prob)
                e.compile = {"seconds": seconds, "built": len(built.built), "max_rows": limits[
                    "none" if mode == "ar" else "nar"]}
                engines.append(e)
    if ct2.available():
        hf = bart_from_yue2(model).eval()
        forced = model.generation_config.forced_eos_token_id
        for quant in dtypes:
            path = ct2.convert(hf, tokenizer, workdir, quantization=quant)
            # Each thread count as an engine of its own, and ratios against the faster at each batch
            # size: one probe text picks 1 thread, which loses at batch 32.
            for threads in sorted({1, torch.get_num_threads()}):
                translator = ct2.TranslatorProcess(path, probe, compute_type="default", threads=[threads])
                engines.append(peer(translator, tokenizer, f"CTranslate2 {quant} ({threads} thr)", quant,
                                    max_new_tokens=max_new_tokens, forced_eos=forced, **controls))
    return engines


def report(engines: list[Engine], *, batch: int, what: str, refs: list[str] | None = None,
           tokenizer: Any = None) -> list[dict[str, Any]]:
    """Rows for one batch size: speed, step cost, agreement, and (with `refs`) ROUGE-L."""
    by = {e.name: e for e in engines}
    rows = []
    for e in engines:
        tokens = sum(len(o) for o in e.outputs)
        sec = statistics.median(e.seconds)
        ar = by.get(f"ours ar {e.dtype}" + (" compiled" if e.compile else ""))  # a step in its own kind's steps
        row: dict[str, Any] = {"what": what, "engine": e.name, "batch": batch, "dtype": e.dtype, "tokens": tokens,
                               "tok_s": tokens / sec, "ms_per_step": 1e3 * sec / e.steps,
                               "tau": tokens / e.row_steps if e.ours else None,
                               "acceptance": e.nar / e.drafted if e.drafted else None, "compile": e.compile}
        if ar is not None and e.ours:
            row["same_as_ours_ar"] = agreement(e.outputs, ar.outputs)  # ar: the eager one for eager engines
            if e.compile:
                row["same_as_eager"] = agreement(e.outputs, by[e.name.removesuffix(" compiled")].outputs)
            row["step_in_ar_steps"] = row["ms_per_step"] / (1e3 * statistics.median(ar.seconds) / ar.steps)
        if not e.ours and ar is not None:
            row["same_as_ours_ar"] = agreement(e.outputs, ar.outputs)
        if refs is not None:
            preds = [s.strip() for s in tokenizer.batch_decode(e.outputs, skip_special_tokens=True)]
            row["rouge_l"] = 100 * rouge(preds, refs).rougeL
        rows.append(row)
    peers: dict[str, float] = {}  # CTranslate2 at its best thread count here, per dtype
    for r in rows:
        if r["engine"].startswith("CTranslate2"):
            peers[r["dtype"]] = max(peers.get(r["dtype"], 0.0), r["tok_s"])
    for row in rows:
        for dtype, tok_s in peers.items():
            row[f"vs_ct2_{dtype}"] = row["tok_s"] / tok_s
        if row["engine"].startswith("ours hybrid") and row["same_as_ours_ar"] != 1.0:
            # Verification compares argmaxes: a near-tie that a width-1 and a width-(1+K) pass round
            # differently can flip (attention and float kernels sum in another order; int8 requantizes).
            print(f"note: {row['engine']} agrees with our ar on {100 * row['same_as_ours_ar']:.2f} % of tokens "
                  f"({what}, batch {batch})")
    return rows


def print_rows(rows: list[dict[str, Any]]) -> None:
    """A markdown table (docs/measured.md's is this one)."""
    cols = [("what", "what", "{}"), ("batch", "batch", "{}"), ("engine", "engine", "{}"), ("tok/s", "tok_s", "{:.0f}"),
            ("ms/step", "ms_per_step", "{:.2f}"), ("step in ar steps", "step_in_ar_steps", "{:.2f}"),
            ("tau", "tau", "{:.2f}"), ("acceptance", "acceptance", "{:.0%}"),
            ("vs CT2 fp32", "vs_ct2_float32", "{:.2f}x"), ("vs CT2 int8", "vs_ct2_int8", "{:.2f}x"),
            ("same as our ar", "same_as_ours_ar", "{:.1%}"), ("same as eager", "same_as_eager", "{:.1%}"),
            ("ROUGE-L", "rouge_l", "{:.2f}")]
    print("| " + " | ".join(c[0] for c in cols) + " |")
    print("|" + "|".join("---" for _ in cols) + "|")
    for r in rows:
        print("| " + " | ".join(fmt.format(r[key]) if r.get(key) is not None else "-" for _, key, fmt in cols) + " |",
              flush=True)


def random_shapes(args: Any, workdir: Path) -> list[dict[str, Any]]:
    rows = []
    for shape in args.shapes:
        model = random_model(shape, draft_vocab=args.draft_vocab)
        tokenizer = word_tokenizer(model.config.vocab_size)
        g = torch.Generator().manual_seed(1)
        texts = torch.randint(len(SPECIALS), model.config.vocab_size, (max(args.batch_sizes) * 2, args.source),
                              generator=g)
        texts[:, 0], texts[:, -1] = 0, model.config.eos_token_id
        probe = [tokenizer.convert_ids_to_tokens(texts[0].tolist())]
        engines = engines_for(model, tokenizer, workdir / f"random-{shape}", probe, max_new_tokens=args.new_tokens,
                           min_accept_prob=0.0, controls={})
        for bs in args.batch_sizes:
            n = bs * (2 if bs > 1 else 3)
            batches = [{"input_ids": texts[i : i + bs], "attention_mask": torch.ones_like(texts[i : i + bs])}
                       for i in range(0, min(n, texts.shape[0]), bs)]
            measure(engines, batches, args.repeats)
            rows += report(engines, batch=bs, what=f"random {shape}")
            print_rows(rows[-len(engines):])
        del model, engines
    return rows


def controls_of(model: Yue2ForConditionalGeneration) -> dict[str, Any]:
    """The checkpoint's repetition controls, as CTranslate2's `translate_batch` takes them."""
    gen = model.generation_config
    return {"repetition_penalty": gen.repetition_penalty or 1.0, "no_repeat_ngram_size": gen.no_repeat_ngram_size or 0}


def probe_of(tokenizer: Any, text: str) -> list[list[str]]:
    """One text as CTranslate2's token strings: what picks its thread count."""
    return [tokenizer.convert_ids_to_tokens(tokenizer(text, truncation=True, max_length=256)["input_ids"])]


def shipped(args: Any, workdir: Path) -> list[dict[str, Any]]:
    rows = []
    for name in args.checkpoints:
        model, tokenizer = load_checkpoint(ROOT / "checkpoints" / name)
        data = read_split(ROOT / "data", "general" if name == "base" else name, "eval")[: args.texts]
        texts, refs = [r["text"] for r in data], [r["summary"] for r in data]
        controls, probe = controls_of(model), probe_of(tokenizer, texts[0])
        engines = engines_for(model, tokenizer, workdir / f"shipped-{name}", probe, max_new_tokens=args.max_new_tokens,
                           min_accept_prob=0.05, controls=controls)
        for bs in args.batch_sizes:
            batches = [dict(tokenizer(texts[i : i + bs], truncation=True, max_length=256, padding=True,
                                      return_tensors="pt")) for i in range(0, len(texts), bs)]
            measure(engines, batches, args.repeats)
            rows += report(engines, batch=bs, what=f"shipped {name}", refs=refs, tokenizer=tokenizer)
            print_rows(rows[-len(engines):])
    return rows


def main() -> None:
    parser = parser_with_common_arguments(__doc__, out_name="peers.json", texts_default=48,
                                          texts_help="eval texts per shipped checkpoint")
    parser.set_defaults(batch_sizes=[1, 8])
    parser.add_argument("--shapes", nargs="*", default=["base", "large"], choices=sorted(SHAPES))
    parser.add_argument("--checkpoints", nargs="*", default=["base", "legal"])
    parser.add_argument("--source", type=int, default=128, help="source tokens (random shapes)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens each row decodes (random shapes)")
    parser.add_argument("--draft-vocab", type=int, default=10000,
                        help="draft vocabulary of the random models (0: the whole vocabulary)")
    args = parser.parse_args()
    apply_common_arguments(args)
    if not ct2.available():
        print("ctranslate2 is not installed: our engines only")
    with tempfile.TemporaryDirectory(prefix="yue2-peers-") as tmp:
        rows = random_shapes(args, Path(tmp)) + shipped(args, Path(tmp))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
            "python": platform.python_version(), "repeats": args.repeats, "source": args.source,
            "new_tokens": args.new_tokens, "draft_vocab": args.draft_vocab, "texts": args.texts}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
