"""Static micro-batching vs continuous batching on a mixed-length workload, side by side.

Both policies run the same engine (`yue2_jobs.decode.continuous.ContinuousBatcher`), the same
kernels and the same row bound; only admission differs:

- `static`: a batch of up to `--rows` jobs is admitted into an empty working set and decodes until
  its last row is done (finished rows are dropped once a quarter of the set, as `generate` does);
- `continuous`: a finished row's slot is refilled from the queue at the next step.

Workload: the eval set's inputs, each job's output length drawn uniformly from 8 to 256 tokens
(`min_new_tokens = max_new_tokens`, so lengths are exact whatever the summariser would stop at),
greedy decoding (`--mode hybrid`, the default, or `ar`). Two scenarios:

- `offline`: every job queued at t=0 (an overnight batch); latency = time to its completion;
- `arrivals`: jobs arrive as a Poisson process at `--load` x the static policy's offline job
  rate; latency = completion - arrival.

Each repeat runs both policies in alternating order (this VM is noisy); medians are reported.

    python benchmarks/continuous.py [--jobs 192] [--rows 32] [--repeats 2] [--threads 0] [--mode hybrid|ar]
                                    [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Literal

import torch
from bench_args import ROOT
from transformers.utils import logging as hf_logging

from yue2_jobs.decode.params import DecodingParams, Mode
from yue2_jobs.decode.requests import DecodeRequest
from yue2_jobs.decode.session import DecodeSession
from yue2_jobs.training.data import read_split

POLICIES: tuple[Literal["static", "continuous"], ...] = ("static", "continuous")


def workload(ids: list[list[int]], n: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [(ids[i % len(ids)], rng.randint(8, 256)) for i in range(n)]


def run(session: DecodeSession, jobs: list[tuple[list[int], int]], *, policy: Literal["continuous", "static"],
        rows: int, arrivals: list[float] | None, mode: Mode = "hybrid") -> dict[str, float]:
    eng = session.engine(max_rows=rows, policy=policy)
    reqs = [DecodeRequest(key=i, input_ids=x, min_new_tokens=m, params=DecodingParams(mode=mode, max_new_tokens=m))
            for i, (x, m) in enumerate(jobs)]
    arrive = arrivals or [0.0] * len(reqs)
    latencies: list[float] = []
    tokens = 0
    nxt = 0
    t0 = time.perf_counter()
    while nxt < len(reqs) or eng.has_work():
        now = time.perf_counter() - t0
        while nxt < len(reqs) and arrive[nxt] <= now:
            eng.submit([reqs[nxt]])
            nxt += 1
        if not eng.has_work():  # idle until the next arrival (open-loop load)
            time.sleep(max(0.0, arrive[nxt] - (time.perf_counter() - t0)))
            continue
        for res in eng.step():
            assert res.error is None and len(res.tokens) == res.request.params.max_new_tokens, res
            latencies.append(time.perf_counter() - t0 - arrive[res.request.key])
            tokens += len(res.tokens)
    wall = time.perf_counter() - t0
    c = eng.counters
    latencies.sort()
    return {"wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall, "jobs_per_s": len(reqs) / wall,
            "steps": c.steps, "mean_rows_per_step": c.live_rows / c.steps,
            "p50_latency_s": latencies[len(latencies) // 2],
            "p95_latency_s": latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=192)
    p.add_argument("--rows", type=int, default=32, help="row bound (engine_max_rows) for both policies")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--load", type=float, default=0.8, help="arrival rate as a share of static offline jobs/s")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default, as a worker runs)")
    p.add_argument("--mode", default="hybrid", choices=["hybrid", "ar", "auto"])
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (CUDA when visible)")
    p.add_argument("--dtype", default="auto", help="auto: bf16 on CUDA, fp32 on the CPU (YUE2_DTYPE)")
    p.add_argument("--no-graphs", action="store_true", help="on CUDA, step eagerly instead of replaying graphs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "base"))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "continuous.json"))
    args = p.parse_args()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    session = DecodeSession.load(args.checkpoint, device=args.device, dtype=args.dtype)
    tok = session.tokenizer
    assert tok is not None
    if session.device.type == "cuda" and not args.no_graphs:
        captured = session.capture_graphs(max_rows=args.rows, min_lengths=(True,))  # its jobs set min lengths
        print(f"{sum(g.count for g in captured)} CUDA graphs captured in {sum(g.capture_s for g in captured):.1f}s")
    texts = [r["text"] for r in read_split(ROOT / "data", "general", "eval")]
    ids = tok(texts, truncation=True, max_length=128)["input_ids"]
    jobs = workload(ids, args.jobs, args.seed)
    run(session, jobs[:8], policy="continuous", rows=args.rows, arrivals=None)  # warm-up
    runs: dict[str, dict[str, list[dict[str, float]]]] = {"offline": {}, "arrivals": {}}
    for rep in range(args.repeats):
        order = POLICIES if rep % 2 == 0 else POLICIES[::-1]
        for policy in order:
            runs["offline"].setdefault(policy, []).append(run(session, jobs, policy=policy, rows=args.rows,
                                                                  arrivals=None, mode=args.mode))
    static_rate = statistics.median(r["jobs_per_s"] for r in runs["offline"]["static"])
    rng = random.Random(args.seed + 1)
    t, arrivals = 0.0, []
    for _ in jobs:
        t += rng.expovariate(args.load * static_rate)
        arrivals.append(t)
    for rep in range(args.repeats):
        order = POLICIES if rep % 2 == 0 else POLICIES[::-1]
        for policy in order:
            runs["arrivals"].setdefault(policy, []).append(run(session, jobs, policy=policy, rows=args.rows,
                                                                   arrivals=arrivals, mode=args.mode))
    med = {sc: {pol: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for pol, rs in pols.items()}
           for sc, pols in runs.items()}
    lengths = [m for _, m in jobs]
    print(f"{len(jobs)} {args.mode} jobs, output lengths {min(lengths)}-{max(lengths)} "
          f"(mean {statistics.mean(lengths):.0f}), row bound {args.rows}, "
          f"torch threads {torch.get_num_threads()}, median of {args.repeats}")
    head = f"{'scenario':<9} {'policy':<11} {'tokens/s':>9} {'ratio':>6} {'rows/step':>9} {'steps':>6} " \
           f"{'p50 lat s':>9} {'p95 lat s':>9} {'wall s':>7}"
    print(head)
    for sc, pols in med.items():
        base = pols["static"]["tokens_per_s"]
        for pol in POLICIES:
            m = pols[pol]
            print(f"{sc:<9} {pol:<11} {m['tokens_per_s']:>9.0f} {m['tokens_per_s'] / base:>5.2f}x "
                  f"{m['mean_rows_per_step']:>9.1f} {m['steps']:>6.0f} {m['p50_latency_s']:>9.2f} "
                  f"{m['p95_latency_s']:>9.2f} {m['wall_s']:>7.1f}")
    if "arrivals" in med:
        print(f"(arrivals: Poisson at {args.load:.0%} of static's offline rate, {args.load * static_rate:.1f} jobs/s)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.processor() or platform.machine(), "args": vars(args),
                               "medians": med, "runs": runs}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
