"""What a pipeline worker costs, for benchmarks/pipeline.py: the CPU of its processes and threads
(`CpuLedger`), a py-spy profile of its threads, and the figures its micro-batch log lines give.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from statistics import median
from typing import Any

from procs import core_times, cpu_seconds, run_queue_wait, threads

# workers/tasks.py, at the end of each micro-batch (logging's default asctime, then the message).
# Parts the line may go on to give after a `;` ("claim 0.412s, waiting for the recorder 1.200s")
# are summed by name.
MICRO_BATCH = re.compile(r"^(?:(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) )?.*micro-batch of (?P<jobs>\d+) jobs "
                         r"\(and (?P<others>\d+) of other tenants\) in (?P<total>[\d.]+)s, "
                         r"(?P<decode>[\d.]+)s of it decoding(?:[;,] (?P<parts>.*))?$")
PART = re.compile(r"([a-z][\w /-]*?):? (\d+(?:\.\d+)?)s\b")


class CpuLedger:
    """CPU seconds of groups of processes, and CPU and run-queue wait of the worker's threads,
    between `start` and `stop`. A process that appears meanwhile counts from zero; one that exits
    meanwhile is lost (Postgres backends of other connections come and go; this run's pools stay)."""

    def __init__(self, groups: dict[str, Any], worker: int, worker_cpus: list[int] | None,
                 worker_groups: tuple[str, ...]) -> None:
        self.groups, self.worker = groups, worker  # name -> callable giving its pids now
        self.worker_cpus, self.worker_groups = worker_cpus, worker_groups
        self.t0 = 0.0
        self.before: dict[int, float] = {}
        self.threads_before: dict[int, tuple[float, float]] = {}
        self.core0 = (0.0, 0.0)

    def _snapshot(self) -> tuple[dict[str, dict[int, float]], dict[int, tuple[float, float]]]:
        procs = {name: {pid: cpu_seconds(pid) or 0.0 for pid in pids()} for name, pids in self.groups.items()}
        tids = {tid: (cpu_seconds(f"{self.worker}/task/{tid}") or 0.0, run_queue_wait(self.worker, tid))
                for tid in threads(self.worker)}
        return procs, tids

    def start(self) -> None:
        procs, self.threads_before = self._snapshot()
        self.before = {pid: s for g in procs.values() for pid, s in g.items()}
        self.core0 = core_times(self.worker_cpus) if self.worker_cpus else (0.0, 0.0)
        self.t0 = time.perf_counter()

    def stop(self, thread_names: dict[int, str]) -> dict[str, Any]:
        wall = time.perf_counter() - self.t0
        procs, tids = self._snapshot()
        by_group = {name: sum(s - self.before.get(pid, 0.0) for pid, s in g.items()) for name, g in procs.items()}
        by_thread: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for tid, (cpu, wait) in tids.items():
            cpu0, wait0 = self.threads_before.get(tid, (0.0, 0.0))
            name = thread_names.get(tid, f"tid {tid}")
            by_thread[name][0] += cpu - cpu0
            by_thread[name][1] += wait - wait0
        ranked = sorted(by_thread.items(), key=lambda kv: -kv[1][0])
        out: dict[str, Any] = {"wall_s": wall, "processes": by_group,
                               "worker_threads": {n: {"cpu_s": c, "run_queue_wait_s": w} for n, (c, w) in ranked}}
        # The thread that used the most CPU decodes: how long it waited for its CPU, against the
        # bare decoder's, says how much contention the pipeline added.
        out["decode_thread"] = {"name": ranked[0][0], "run_queue_wait": ranked[0][1][1] / wall} if ranked else {}
        if self.worker_cpus:
            busy, steal = (b - a for a, b in zip(self.core0, core_times(self.worker_cpus), strict=True))
            ours = sum(by_group[g] for g in self.worker_groups)
            out["worker_cpus"] = {"busy_s": busy, "ours_s": ours, "steal_s": steal,
                                  "other_load": max(0.0, busy - ours) / (wall * len(self.worker_cpus))}
        return out


def py_spy() -> str | None:
    return shutil.which("py-spy") or next((str(p) for p in [Path(sys.executable).parent / "py-spy"] if p.exists()),
                                          None)


def thread_names(pid: int) -> dict[int, str]:
    """The worker's Python thread names by thread id (`py-spy dump`; {} without py-spy)."""
    spy = py_spy()
    if spy is None:
        return {}
    out = subprocess.run([spy, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True, text=True).stdout
    return {int(m[1]): m[2] for m in re.finditer(r'^Thread (\d+) \([^)]*\): "([^"]*)"', out, re.M)}


# Frames that structure a micro-batch's work: a sample is put down to the function its innermost
# one of these called (or to that frame itself, when it was running its own lines).
STRUCTURE = {"run_jobs", "process_jobs", "run_continuous", "_continuous_loop", "_admit_group", "_Finished.flush",
             "MicroBatch.__exit__", "record", "MicroBatch._finalize_early", "MicroBatch._finalize"}
PROFILE_HZ = 50
WRAPPERS = {"context_decorator.<locals>.decorate_context", "in_db", "retrying"}  # looked through


def profile_summary(raw: str, rate: float) -> dict[str, dict[str, float]]:
    """py-spy's raw (collapsed) samples of the worker -> per thread, seconds by what it was doing
    (`STRUCTURE`); samples outside any of those frames are `idle/other`."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack.startswith("thread"):
            continue
        head, *frames = stack.split(";")
        name = head.split(": ", 1)[-1]
        funcs = [f.split(" (", 1)[0] for f in frames]  # outermost first
        where = "idle/other"
        for i in range(len(funcs) - 1, -1, -1):
            if funcs[i] in STRUCTURE:
                callees = [f for f in funcs[i + 1:] if f not in WRAPPERS]
                where = callees[0] if callees else f"{funcs[i]} (own lines)"
                break
        out[name][where] += int(count) / rate
    return {n: dict(sorted(d.items(), key=lambda kv: -kv[1])) for n, d in out.items()}


def worker_log_figures(text: str, *, t0_wall: float, end_wall: float, tokens: int, batch: int) -> dict[str, Any]:
    """The worker's micro-batches (its log between two offsets): their time outside the engine loop,
    and where the end-to-end time went (submit and first delivery, micro-batches, gaps between them,
    the tail to the batch's completion)."""
    mbs = [m.groupdict() for m in map(MICRO_BATCH.search, text.splitlines()) if m]
    if not mbs:
        return {"micro_batches": 0}
    jobs = [int(m["jobs"]) + int(m["others"]) for m in mbs]
    total = [float(m["total"]) for m in mbs]
    decode = [float(m["decode"]) for m in mbs]
    outside = [(t - d) / t for t, d in zip(total, decode, strict=True) if t > 0]
    total_s, decode_s = sum(total), sum(decode)
    parts: dict[str, float] = defaultdict(float)
    for m in mbs:
        for name, seconds in PART.findall(m["parts"] or ""):
            parts[name.strip()] += float(seconds)
    timeline = {}
    if all(m["ts"] for m in mbs):
        ends = [datetime.strptime(m["ts"], "%Y-%m-%d %H:%M:%S,%f").timestamp() for m in mbs]
        starts = [e - t for e, t in zip(ends, total, strict=True)]
        timeline = {"head_s": starts[0] - t0_wall, "tail_s": end_wall - ends[-1],
                    "gaps_s": sum(max(0.0, s - e) for e, s in zip(ends, starts[1:], strict=False))}
    return {
        "micro_batches": len(mbs), "jobs": sum(jobs), "jobs_per_micro_batch_median": median(jobs),
        "total_s": total_s, "decode_s": decode_s,
        "outside_loop": (total_s - decode_s) / total_s if total_s else 0.0,
        "outside_loop_per_micro_batch": {"median": median(outside), "max": max(outside), "min": min(outside)},
        "outside_loop_ms_per_group": 1000 * (total_s - decode_s) / sum(jobs) * batch,
        "loop_tokens_per_s": tokens / decode_s if decode_s else 0.0, "parts_s": dict(parts), **timeline,
    }
