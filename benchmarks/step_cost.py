"""What one engine step costs on random weights in BART shapes: `ar` (width 1) and `hybrid` (verify
1 + K slots, then draft K), tokens/s at tau 1 and the step's share of the memory-bandwidth roofline.

Random weights draft nothing useful, so this measures cost, not acceptance: a `hybrid` step commits
tau tokens on real checkpoints (`decode.py` reports tau), and `hybrid` beats `ar` when tau exceeds
the step-cost ratio printed here. Rows never finish (a minimum length longer than the run), the
source is `--source` tokens long and the caches hold `--new-tokens` positions. On CUDA the step is
replayed from a CUDA graph (`--no-graphs`: eager), in `--dtype` (default bf16 on CUDA).

    python benchmarks/step_cost.py --shapes base large --batch-sizes 1 32 --out results/step_cost.json
    python benchmarks/step_cost.py --shapes base --batch-sizes 1 8 --weights int8   # the int8 matrices (CPU)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from yue2_jobs.decode.engine import NEVER_TRUST, StepShape, engine_step
from yue2_jobs.decode.graphs import StepGraphs
from yue2_jobs.decode.layout import WEIGHT_FORMATS, StepLayout, WeightFormat
from yue2_jobs.decode.rows import Rows
from yue2_jobs.model import Yue2Config, Yue2ForConditionalGeneration
from yue2_jobs.model.device import resolve_device, resolve_dtype

SHAPES = {  # BART's published sizes; `tiny` is for tests
    "tiny": dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=512),
    "base": dict(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                 decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072, vocab_size=50265),
    "large": dict(d_model=1024, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16,
                  decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, vocab_size=50265),
}
HBM_GBPS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0}


def step_bytes(model: Yue2ForConditionalGeneration, *, drafting: bool) -> int:
    """Weight bytes a batch-1 step reads: AR branch and vocabulary, plus the NAR branch when drafting."""
    parts = [model.decoder_layers, model.shared]
    if drafting:
        parts += [model.nar_layers, model.confidence_head]
    return sum(p.numel() * p.element_size() for part in parts for p in part.parameters())


def time_steps(model: Yue2ForConditionalGeneration, *, batch: int, source: int, new_tokens: int, drafts: str,
               graphs: bool, steps: int, weights: WeightFormat = "float") -> float:
    """Seconds per engine step, median of 3 runs of `steps` steps."""
    cfg, dev = model.config, model.shared.weight.device
    k = cfg.nar_block_size
    total = 1 + new_tokens
    with torch.inference_mode():
        ids = torch.randint(4, cfg.vocab_size, (batch, source), device=dev)
        enc = model.encode(ids)
        shape = StepShape.of(k=k, drafts=drafts, ban_eos=True)  # type: ignore[arg-type]
        rows = Rows.empty(batch, k=k, t_buf=total + 2 * k + 2, device=dev)
        idx = torch.arange(batch, device=dev)
        ones = torch.ones(batch, device=dev)
        rows.start(idx, start_token=cfg.decoder_start_token_id, pad=cfg.pad_token_id, total=idx * 0 + total,
                   min_total=idx * 0 + total, draft_on=ones.bool(), accept_p=ones * 0.0, trust_p=ones * NEVER_TRUST)
        caches = model.new_caches(batch_size=batch, max_len=total + k + 1)
        fresh = {name: t.clone() for name, t in rows.tensors().items()}
        layout = StepLayout(model, weights=weights)
        replay = StepGraphs.capture(model, shape=shape, layout=layout, buckets=(batch,)) if graphs else None
        runs = []
        for _ in range(3):
            for name, t in fresh.items():  # restart: rows must not reach their length limit
                getattr(rows, name).copy_(t)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            for _ in range(steps):
                if replay is None or not replay.run(rows, enc, caches):
                    engine_step(model, rows, enc, caches, layout=layout, shape=shape, span=total + k + 1)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            runs.append((time.perf_counter() - t0) / steps)
        return sorted(runs)[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=["base", "large"], choices=sorted(SHAPES))
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    p.add_argument("--source", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=64, help="steps per run (and cache positions)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--no-graphs", action="store_true")
    p.add_argument("--weights", default="float", choices=WEIGHT_FORMATS, help="int8: the int8 matrices (CPU)")
    p.add_argument("--hbm-gbps", type=float, default=0.0)
    p.add_argument("--out", default="benchmarks/results/step_cost.json")
    args = p.parse_args()
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    bandwidth = args.hbm_gbps or next((v for name, v in HBM_GBPS.items() if gpu and name in gpu), 0.0)
    graphs = device.type == "cuda" and not args.no_graphs
    rows = []
    print(f"{'shape':<6} {'batch':>5} {'mode':<7} {'step':>10} {'tok/s @tau1':>12} {'roofline':>10} {'share':>7}")
    for name in args.shapes:
        torch.manual_seed(0)
        cfg = Yue2Config(**SHAPES[name], max_position_embeddings=max(1024, args.source + args.new_tokens + 8),
                         nar_layers=1, nar_block_size=4)
        model = Yue2ForConditionalGeneration(cfg).eval().to(device, dtype=dtype)
        for batch in args.batch_sizes:
            for mode, drafts in (("ar", "none"), ("hybrid", "nar")):
                sec = time_steps(model, batch=batch, source=args.source, new_tokens=args.new_tokens, drafts=drafts,
                                 weights=args.weights, graphs=graphs, steps=args.new_tokens)
                row = {"shape": name, "batch": batch, "mode": mode, "step_s": sec, "tok_s_at_tau_1": batch / sec,
                       "dtype": str(dtype), "weights": args.weights, "graphs": graphs}
                if bandwidth and batch == 1:
                    row["roofline_tok_s"] = bandwidth * 1e9 / step_bytes(model, drafting=drafts == "nar")
                    row["share_of_roofline"] = row["tok_s_at_tau_1"] / row["roofline_tok_s"]
                rows.append(row)
                roof = f"{row['roofline_tok_s']:>10.0f} {100 * row['share_of_roofline']:>6.1f}%" \
                    if "roofline_tok_s" in row else f"{'-':>10} {'-':>7}"
                print(f"{name:<6} {batch:>5} {mode:<7} {sec * 1e6:>8.0f}us {row['tok_s_at_tau_1']:>12.0f} {roof}",
                      flush=True)
            ar, hy = (r["step_s"] for r in rows[-2:])
            print(f"{'':<6} {'':>5} hybrid step = {hy / ar:.2f} ar steps")
        del model
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": gpu or "cpu", "hbm_gbps": bandwidth or None, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
