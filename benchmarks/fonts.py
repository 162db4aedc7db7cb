"""Render jobs: renders/s of the renderer alone (per output format) and through the pipeline.

Workload (fixed seed): short CJK labels, mixed CJK/Latin sentences and wrapped paragraphs of
Chinese and of English (the eval set's inputs), the four styles in turn, pen pressure 0..1.

1. **direct**: `render()` in this process, for `svg`, `png` and `both`, alternating formats
   per repeat (this VM is noisy); renders/s, glyphs/s, p50/p95 ms.
2. **pipeline**: the same jobs (`both`) as one `/v1/render_font` batch on the embedded pipeline
   (SQLite, filesystem queue, local storage) with one `yue2 worker --variant fonts` process:
   renders/s from submit to the batch's completion, beside direct `both` from step 1.

    python benchmarks/fonts.py [--jobs 240] [--repeats 3] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from yue2_jobs.fonts.catalog import STYLES  # noqa: E402
from yue2_jobs.fonts.render import RenderParams, render  # noqa: E402

POEMS = ["床前明月光，疑是地上霜。举头望明月，低头思故乡。", "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。",
         "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。", "千山鸟飞绝，万径人踪灭。孤舟蓑笠翁，独钓寒江雪。"]
LABELS = ["登录", "设置", "保存更改", "你好，世界 Hello", "下载 PDF", "用户名 Username", "確認", "返回首页"]


def workload(n: int, seed: int = 7) -> list[dict]:
    from yue2_jobs.training.data import read_split

    english = [r["text"][:300] for r in read_split(ROOT / "data", "general", "eval")]
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        kind = i % 4
        text = (rng.choice(LABELS) if kind == 0 else rng.choice(POEMS) if kind == 1
                else "".join(rng.sample(POEMS, 3)) if kind == 2 else rng.choice(english))
        jobs.append({"text": text, "style": STYLES[i % len(STYLES)], "pen_pressure": round(rng.random(), 2),
                     "font_size": 32 if kind >= 2 else 48, "wrap_width": 640})
    return jobs


def direct(jobs: list[dict], fmt: str) -> dict[str, float]:
    times, glyphs = [], 0
    t0 = time.perf_counter()
    for job in jobs:
        t = time.perf_counter()
        r = render(RenderParams(**job, output=fmt))
        times.append(time.perf_counter() - t)
        glyphs += r.glyphs
    wall = time.perf_counter() - t0
    times.sort()
    return {"renders_per_s": len(jobs) / wall, "glyphs_per_s": glyphs / wall,
            "p50_ms": 1000 * times[len(times) // 2], "p95_ms": 1000 * times[int(len(times) * 0.95)]}


def pipeline(jobs: list[dict]) -> dict[str, float]:
    from yue2_jobs.client import Client
    from yue2_jobs.demo import embedded_stack

    with embedded_stack(prefix="yue2-fonts-bench-", tenant="bench") as stack:
        stack.worker("fonts")
        client = Client(stack.url, stack.key)
        path = stack.home / "in.jsonl"
        path.write_text("".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/render_font",
                                            "body": job}, ensure_ascii=False) + "\n" for i, job in enumerate(jobs)))
        t0 = time.perf_counter()
        batch = client.create_batch(client.upload(path)["id"], endpoint="/v1/render_font")
        state = client.wait(batch["id"], poll_s=0.1, timeout_s=1800)
        wall = time.perf_counter() - t0
    counts = state["request_counts"]
    return {"renders_per_s": counts["completed"] / wall, "completed": counts["completed"], "failed": counts["failed"],
            "wall_s": wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=240)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fonts.json"))
    args = p.parse_args()
    jobs = workload(args.jobs)
    for style in STYLES:  # fonts opened and glyph checks warm before timing
        render(RenderParams(text="预热 warm", style=style))
    formats = ["svg", "png", "both"]
    runs: dict[str, list[dict[str, float]]] = {f: [] for f in formats}
    for rep in range(args.repeats):
        for fmt in formats[rep % 3:] + formats[: rep % 3]:
            runs[fmt].append(direct(jobs, fmt))
    med = {f: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for f, rs in runs.items()}
    piped = pipeline(jobs)
    print(f"{len(jobs)} render jobs (labels, poems, paragraphs; 4 styles), median of {args.repeats}")
    print(f"{'path':<22} {'renders/s':>10} {'glyphs/s':>9} {'p50 ms':>7} {'p95 ms':>7}")
    for fmt in formats:
        m = med[fmt]
        print(f"{'direct ' + fmt:<22} {m['renders_per_s']:>10.1f} {m['glyphs_per_s']:>9.0f} {m['p50_ms']:>7.1f} "
              f"{m['p95_ms']:>7.1f}")
    print(f"{'pipeline both (1 proc)':<22} {piped['renders_per_s']:>10.1f} {'':>9} {'':>7} {'':>7}   "
          f"{piped['renders_per_s'] / med['both']['renders_per_s']:.2f}x of direct; {piped['completed']} done, "
          f"{piped['failed']} failed, {piped['wall_s']:.1f}s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "direct": med, "pipeline": piped}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
