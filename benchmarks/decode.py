"""Decoding modes side by side on the shipped `base` checkpoint and its eval set.

Methods: Hugging Face `generate` (on the same weights exported to BART), CTranslate2 greedy (the
same BART export converted by its Transformers converter; the engine users pick today for fast
encoder-decoders; skipped when the `ctranslate2` package is absent), HF prompt lookup
(`prompt_lookup_num_tokens`, batch 1 only: HF refuses it for larger batches), our `ar`, our
batched `prompt_lookup`, `hybrid`, `hybrid_fast` at three thresholds and `nar`. For each
batch size: tokens/s (generated tokens up to and including EOS; padding never counts),
decoder steps per token, tau (mean tokens committed per decoder step) and its histogram,
ROUGE-L F1 against the references, and exact match (share of outputs identical to our `ar`
greedy output). Every repeat runs every method once, in rotated order, so machine noise
spreads over all of them; medians are reported, and the ratio to our `ar` is the figure to
read. On a GPU (device auto) the batch-1 rows also get the memory-bandwidth roofline:
weight bytes read per decoder step / HBM bandwidth.

    python benchmarks/decode.py [--batch-sizes 1 8 32] [--repeats 3] [--texts 254] [--out results.json]
    python benchmarks/decode.py --checkpoint checkpoints/legal --eval-set legal
    python benchmarks/decode.py --methods CTranslate2 hybrid --batch-sizes 1 8   # a focused run
"""

from __future__ import annotations

import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ct2
import torch
from bench_args import ROOT, apply_common_arguments, parser_with_common_arguments

from yue2_jobs.decode.session import DecodeSession
from yue2_jobs.decode.stats import summarize_stats
from yue2_jobs.model.checkpoint import load_checkpoint
from yue2_jobs.model.convert import bart_from_yue2
from yue2_jobs.training.data import read_split
from yue2_jobs.training.evaluate import rouge

HBM_GBPS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0}  # by GPU name; --hbm-gbps overrides


@dataclass(frozen=True)
class Method:
    name: str
    run: Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, list | None]]
    batch_sizes: tuple[int, ...] | None = None  # None: every batch size
    extra_weights: bool = False  # reads the NAR branch every step (for the roofline)
    lossless: bool = True  # must reproduce our `ar` greedy output exactly, or the benchmark stops


def _methods(session: DecodeSession, hf, *, max_new_tokens: int, thresholds: list[float],
             sync_every: int | None) -> list[Method]:
    model = session.model

    def ours(mode: str, **kw: object) -> Callable:
        def run(b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list]:
            out = session.generate(b["input_ids"], b["attention_mask"], mode=mode, max_new_tokens=max_new_tokens,
                                   sync_every=sync_every, **kw)
            return out.sequences, out.stats
        return run

    def hf_run(**kw: object) -> Callable:
        def run(b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, None]:
            with torch.inference_mode():
                return hf.generate(input_ids=b["input_ids"], attention_mask=b["attention_mask"], num_beams=1,
                                   do_sample=False, max_new_tokens=max_new_tokens, **kw), None
        return run

    methods = [
        Method("HF generate", hf_run()),
        Method("HF prompt lookup", hf_run(prompt_lookup_num_tokens=model.config.nar_block_size), batch_sizes=(1,)),
        Method("ours ar", ours("ar")),
        Method("ours prompt_lookup", ours("prompt_lookup")),
        Method("hybrid", ours("hybrid"), extra_weights=True),
        Method("auto", ours("auto"), extra_weights=True),  # learns over the warm-up run which is faster
    ]
    methods += [Method(f"hybrid_fast@{t:g}", ours("hybrid_fast", nar_threshold=t), extra_weights=True,
                       lossless=False) for t in thresholds]
    methods.append(Method("nar (4 iterations)", ours("nar", nar_iterations=4), extra_weights=True, lossless=False))
    return methods


def _ctranslate2(hf, tokenizer, workdir: Path, *, device: torch.device, max_new_tokens: int) -> Method | None:
    """CTranslate2 greedy on `hf` (our weights exported to BART), or None without the package."""
    if not ct2.available():
        return None
    import ctranslate2

    path = ct2.convert(hf, tokenizer, workdir)
    if device.type == "cuda" and ctranslate2.get_cuda_device_count() > 0:
        translator = ctranslate2.Translator(str(path), device="cuda")
    else:
        probe = [tokenizer.convert_ids_to_tokens(tokenizer("a short probe text to decode " * 8)["input_ids"])]
        translator, threads = ct2.fastest_cpu_translator(path, probe)
        print(f"CTranslate2 on {threads} thread(s)", flush=True)
    start, pad = hf.config.decoder_start_token_id, hf.config.pad_token_id
    forced_eos = getattr(hf.generation_config, "forced_eos_token_id", None)
    gen = hf.generation_config  # the checkpoint's repetition controls, which CTranslate2 implements too
    controls = {"repetition_penalty": gen.repetition_penalty or 1.0,
                "no_repeat_ngram_size": gen.no_repeat_ngram_size or 0}

    def run(b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, None]:
        rows = []
        for ids in ct2.decode_ids(translator, tokenizer, b["input_ids"], b["attention_mask"],
                                  max_new_tokens=max_new_tokens, **controls):
            if forced_eos is not None and len(ids) == max_new_tokens and ids[-1] != forced_eos:
                ids[-1] = forced_eos  # the BART config's forced_eos_token_id, which CTranslate2 does not apply
            rows.append([start, *ids])
        width = max(len(r) for r in rows)
        return torch.tensor([r + [pad] * (width - len(r)) for r in rows]), None

    # Not our arithmetic, so not required to be identical; its exact match is reported.
    return Method("CTranslate2", run, lossless=False)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _generated(seqs: torch.Tensor, pad: int, eos: int) -> list[list[int]]:
    out = []
    for row in seqs[:, 1:].tolist():
        row = [t for t in row if t != pad]
        out.append(row[: row.index(eos) + 1] if eos in row else row)
    return out


def _step_bytes(model, *, with_nar: bool) -> int:
    """Weight bytes one batch-1 decoder step reads: the AR branch and the vocabulary projection,
    plus the NAR branch and confidence head for the modes that draft."""
    parts = [model.decoder_layers, model.shared]
    if with_nar:
        parts += [model.nar_layers, model.confidence_head]
    return sum(p.numel() * p.element_size() for part in parts for p in part.parameters())


def main() -> None:
    parser = parser_with_common_arguments(__doc__, out_name="decode.json", texts_default=0,
                                          texts_help="eval texts to decode (0: all)")
    parser.add_argument("--thresholds", type=float, nargs=3, default=[0.9, 0.7, 0.5])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--hbm-gbps", type=float, default=0.0, help="GPU memory bandwidth (0: from the GPU's name)")
    parser.add_argument("--eval-set", default="general", choices=["general", "legal"])
    parser.add_argument("--methods", nargs="+", default=None,
                        help="only these methods (names as printed; 'ours ar' always runs: it is the reference)")
    parser.add_argument("--sync-every", type=int, default=None, help="steps between host reads (default: device's)")
    args = parser.parse_args()
    apply_common_arguments(args)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)

    model, tokenizer = load_checkpoint(args.checkpoint)
    hf = bart_from_yue2(model).eval().to(device)
    model.to(device)
    rows = read_split(ROOT / "data", args.eval_set, "eval")
    rows = rows[: args.texts] if args.texts else rows
    texts, refs = [r["text"] for r in rows], [r["summary"] for r in rows]
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    methods = _methods(DecodeSession(model), hf, max_new_tokens=args.max_new_tokens, thresholds=args.thresholds,
                       sync_every=args.sync_every)
    workdir = tempfile.TemporaryDirectory(prefix="yue2-ct2-")
    peer = _ctranslate2(bart_from_yue2(model).eval(), tokenizer, Path(workdir.name), device=device,
                        max_new_tokens=args.max_new_tokens)
    if peer is not None:
        methods.insert(1, peer)
    if args.methods:
        methods = [m for m in methods if m.name in args.methods or m.name == "ours ar"]
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    bandwidth = args.hbm_gbps or next((v for k, v in HBM_GBPS.items() if gpu and k in gpu), 0.0)

    results = []
    for bs in args.batch_sizes:
        batches = [{k: v.to(device) for k, v in tokenizer(texts[i : i + bs], truncation=True, max_length=256,
                                                         padding=True, return_tensors="pt").items()}
                   for i in range(0, len(texts), bs)]
        active = [m for m in methods if m.batch_sizes is None or bs in m.batch_sizes]
        outputs: dict[str, list[list[int]]] = {}
        stats: dict[str, list] = {}
        for m in active:  # warm-up run; keeps the outputs and stats
            outputs[m.name], stats[m.name] = [], []
            for b in batches:
                seqs, st = m.run(b)
                outputs[m.name] += _generated(seqs.cpu(), pad, eos)
                stats[m.name] += st or []
        times: dict[str, list[float]] = {m.name: [] for m in active}
        for r in range(args.repeats):
            for m in active[r % len(active) :] + active[: r % len(active)]:
                _sync(device)
                t0 = time.perf_counter()
                for b in batches:
                    m.run(b)
                _sync(device)
                times[m.name].append(time.perf_counter() - t0)
        reference = outputs["ours ar"]
        for m in active:
            if m.lossless and outputs[m.name] != reference:
                raise SystemExit(f"{m.name} differs from our ar greedy output at batch size {bs}; "
                                 "refusing to compare speeds")
        ar_tok_s = 0.0
        for m in active:
            gen = outputs[m.name]
            tokens = sum(len(g) for g in gen)
            seconds = statistics.median(times[m.name])
            summary = summarize_stats(stats[m.name]) if stats[m.name] else None
            steps = summary["decoder_steps"] if summary else (tokens if m.name == "HF generate" else None)
            preds = [s.strip() for s in tokenizer.batch_decode(gen, skip_special_tokens=True)]
            row = {
                "method": m.name, "batch_size": bs, "texts": len(texts), "tokens": tokens, "seconds": times[m.name],
                "tok_s": tokens / seconds, "steps_per_token": steps / tokens if steps else None,
                "tau": tokens / steps if steps else None,
                "accepted_histogram": summary["accepted_histogram"] if summary else None,
                "nar_share": summary["nar_share"] if summary else None,
                "acceptance": summary["acceptance"] if summary else None,
                "rouge_l": 100 * rouge(preds, refs).rougeL,
                "exact_match": sum(a == b for a, b in zip(gen, reference, strict=True)) / len(gen),
            }
            if m.name == "ours ar":
                ar_tok_s = row["tok_s"]
            if bandwidth and bs == 1 and steps:
                step_s = _step_bytes(model, with_nar=m.extra_weights) / (bandwidth * 1e9)
                row["roofline_tok_s"] = row["tau"] / step_s
                row["share_of_roofline"] = row["tok_s"] / row["roofline_tok_s"]
            results.append(row)
        for row in results:
            if row["batch_size"] == bs:
                row["vs_ours_ar"] = row["tok_s"] / ar_tok_s
                _print_row(row, first=row is results[-len(active)])

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
            "device": gpu or "cpu", "hbm_gbps": bandwidth or None, "python": platform.python_version(),
            "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "checkpoint": args.checkpoint,
            "eval_set": args.eval_set,
            "step_weight_bytes": {"ar": _step_bytes(model, with_nar=False),
                                  "hybrid": _step_bytes(model, with_nar=True)}}
    out.write_text(json.dumps({"meta": meta, "rows": results}, indent=2) + "\n")
    print(f"\nwrote {out}")


def _print_row(row: dict, *, first: bool) -> None:
    if first:
        print(f"\nbatch {row['batch_size']} ({row['texts']} texts)")
        print(f"  {'method':<22} {'tok/s':>8} {'vs ar':>6} {'steps/tok':>9} {'tau':>5} {'ROUGE-L':>7} {'exact':>6}"
              f"  histogram (NAR tokens per step: 0, 1, ...)")
    steps = f"{row['steps_per_token']:.3f}" if row["steps_per_token"] else "-"
    tau = f"{row['tau']:.2f}" if row["tau"] else "-"
    hist = row["accepted_histogram"] or "-"
    roof = f"  roofline {row['roofline_tok_s']:.0f} tok/s ({100 * row['share_of_roofline']:.1f}%)" \
        if "roofline_tok_s" in row else ""
    print(f"  {row['method']:<22} {row['tok_s']:>8.1f} {row['vs_ours_ar']:>5.2f}x {steps:>9} {tau:>5} "
          f"{row['rouge_l']:>7.2f} {100 * row['exact_match']:>5.1f}%  {hist}{roof}", flush=True)


if __name__ == "__main__":
    main()
