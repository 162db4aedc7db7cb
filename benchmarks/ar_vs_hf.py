"""Decode speed: YuE2 `ar` mode vs Hugging Face `generate` on identical weights.

Two weight sets: a randomly initialised BART converted to YuE2 (HF runs the original
BartForConditionalGeneration), and the shipped `base` checkpoint (HF runs its export to
BartForConditionalGeneration). Greedy, batch sizes 1, 8 and 32, real held-out inputs.
Tokens/s counts generated tokens up to and including EOS, never padding. Both sides must
produce identical tokens, or the benchmark stops. Runs alternate between the two sides so
machine noise hits both; the ratio is the figure to read.

    python benchmarks/ar_vs_hf.py [--batch-sizes 1 8 32] [--repeats 5] [--out results.json]
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from bench_args import ROOT, apply_common_arguments, parser_with_common_arguments
from transformers import BartConfig, BartForConditionalGeneration

from yue2_jobs.decode.session import DecodeSession
from yue2_jobs.model.checkpoint import load_checkpoint
from yue2_jobs.model.convert import bart_from_yue2, yue2_from_bart
from yue2_jobs.training.data import read_split


def _random_bart(vocab_size: int) -> BartForConditionalGeneration:
    torch.manual_seed(0)
    cfg = BartConfig(vocab_size=vocab_size, d_model=256, encoder_layers=3, decoder_layers=3,
                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=1024,
                     decoder_ffn_dim=1024, max_position_embeddings=320)
    bart = BartForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # random weights would end every row at once; keep rows going to the limit
        bart.final_logits_bias[0, cfg.eos_token_id] = -10.0
    return bart


def _generated_tokens(seqs: torch.Tensor, pad: int) -> int:
    return int((seqs[:, 1:] != pad).sum())


def _time(fn: Callable[[], torch.Tensor]) -> tuple[float, torch.Tensor]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def bench_pair(name: str, ours_model, hf_model, batches: list[dict[str, torch.Tensor]], *, max_new_tokens: int,
               repeats: int, batch_size: int) -> dict[str, object]:
    pad = ours_model.config.pad_token_id
    session = DecodeSession(ours_model)

    def run_ours(b: dict[str, torch.Tensor]) -> torch.Tensor:
        return session.generate(b["input_ids"], b["attention_mask"], mode="ar",
                                max_new_tokens=max_new_tokens).sequences

    def run_hf(b: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.inference_mode():
            return hf_model.generate(input_ids=b["input_ids"], attention_mask=b["attention_mask"], num_beams=1,
                                     do_sample=False, max_new_tokens=max_new_tokens)

    for b in batches:  # warm-up, and the identical-output check
        a, h = run_ours(b), run_hf(b)
        if not torch.equal(a, h):
            raise SystemExit(f"{name}: outputs differ at batch size {batch_size}; refusing to compare speeds")
    times: dict[str, list[float]] = {"ours": [], "hf": []}
    tokens = 0
    for _ in range(repeats):
        t_ours = t_hf = 0.0
        tokens = 0
        for b in batches:
            dt, out = _time(lambda b=b: run_ours(b))
            t_ours += dt
            tokens += _generated_tokens(out, pad)
            dt, _ = _time(lambda b=b: run_hf(b))
            t_hf += dt
        times["ours"].append(t_ours)
        times["hf"].append(t_hf)
    ours_s, hf_s = statistics.median(times["ours"]), statistics.median(times["hf"])
    return {"weights": name, "batch_size": batch_size, "tokens": tokens, "ours_tok_s": tokens / ours_s,
            "hf_tok_s": tokens / hf_s, "speedup": hf_s / ours_s, "ours_s": times["ours"], "hf_s": times["hf"]}


def main() -> None:
    parser = parser_with_common_arguments(__doc__, out_name="ar_vs_hf.json", texts_default=32,
                                          texts_help="held-out texts decoded per timing")
    args = parser.parse_args()
    apply_common_arguments(args)

    base_dir = Path(args.checkpoint)
    base, tokenizer = load_checkpoint(base_dir)
    random_bart = _random_bart(base.config.vocab_size)
    pairs = [
        ("converted-bart (random, d=256, 3+3 layers)", yue2_from_bart(random_bart), random_bart),
        ("shipped base (d=192, 2+2 layers)", base, bart_from_yue2(base)),
    ]
    texts = [r["text"] for r in read_split(ROOT / "data", "general", "eval")[: args.texts]]
    rows = []
    for bs in args.batch_sizes:
        batches = [dict(tokenizer(texts[i : i + bs], truncation=True, max_length=256, padding=True,
                                  return_tensors="pt")) for i in range(0, len(texts), bs)]
        if bs == 1:
            batches = batches[:8]  # batch 1 is the slow case; 8 texts are plenty
        for name, ours, hf in pairs:
            row = bench_pair(name, ours, hf, batches, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                             batch_size=bs)
            rows.append(row)
            print(f"{row['weights']:<44} batch {bs:>3}: ours {row['ours_tok_s']:>8.1f} tok/s   "
                  f"HF {row['hf_tok_s']:>8.1f} tok/s   ratio {row['speedup']:.2f}x", flush=True)

    print()
    print(f"{'weights':<44} {'batch':>5} {'tokens':>7} {'ours tok/s':>11} {'HF tok/s':>10} {'ours/HF':>8}")
    for r in rows:
        print(f"{r['weights']:<44} {r['batch_size']:>5} {r['tokens']:>7} {r['ours_tok_s']:>11.1f} "
              f"{r['hf_tok_s']:>10.1f} {r['speedup']:>7.2f}x")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
            "python": platform.python_version(), "max_new_tokens": args.max_new_tokens, "repeats": args.repeats}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
