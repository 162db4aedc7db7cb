"""`yue2-worker`: one Celery worker process per GPU, each bound to its GPU's NUMA node, supervised.

`plan_children` turns a host (GPUs, NUMA nodes, usable CPUs) into child specs:

- a GPU host: child i sees only GPU i (`CUDA_VISIBLE_DEVICES`, by UUID when NVML gives one, with
  `CUDA_DEVICE_ORDER=PCI_BUS_ID`), runs on the CPUs of that GPU's NUMA node, has its memory
  bound there by `numactl --cpunodebind --membind` when numactl is installed (the launcher logs
  that memory is not bound when it is not), and is named `gpu<i>@<host>`;
- a CPU-only host: `procs` children named `cpu<i>@<host>`, spread over the NUMA nodes and
  splitting each node's CPUs between them, torch threads = their CPU count.

`Supervisor` starts the children, restarts one that dies with exponential backoff (reset after
it stays up), and turns SIGTERM/SIGINT into a warm shutdown (`procs.WARM`): each child gets
SIGTERM once, finishes and acks its current micro-batch (Celery's warm shutdown; unstarted
deliveries go back to Redis), and exits; one still running `stop_timeout_s` (default
`procs.WORKER_WARM_S`, 60 s) later is SIGKILLed (its claims lapse and the reconciler reruns its
jobs: nothing is lost). A second SIGTERM/SIGINT SIGKILLs them at once. Either way the launcher
exits within `stop_timeout_s + procs.KILL_S` of the first signal, whether the signal came to it
alone or to its whole process group (the children then get it too, and Celery ignores the
launcher's repeat).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from workers.topology import GpuInfo, gpu_numa_node, numa_nodes, usable_cpus
from yue2_jobs.core.procs import KILL_S, WARM, die_with_parent, wait_exited

log = logging.getLogger("yue2.launcher")
STABLE_S = 60.0  # a child up this long has its restart backoff reset


@dataclass
class ChildSpec:
    """One worker process: its node name, environment additions, CPUs, NUMA node, command."""

    name: str
    env: dict[str, str]
    cpus: list[int]
    numa_node: int | None
    argv: list[str]


def _split(cpus: list[int], parts: int) -> list[list[int]]:
    """`cpus` in `parts` contiguous, near-equal chunks (a chunk never empty: CPUs are reused when short)."""
    if parts <= len(cpus):
        size, extra = divmod(len(cpus), parts)
        out, start = [], 0
        for i in range(parts):
            end = start + size + (i < extra)
            out.append(cpus[start:end])
            start = end
        return out
    return [[cpus[i % len(cpus)]] for i in range(parts)]


def plan_children(*, variant: str, gpus: list[GpuInfo], procs: int, sysfs: Path = Path("/sys"),
                  cpus: list[int] | None = None, host: str | None = None, numactl: str | None = None,
                  child_argv: list[str] | None = None, metrics_port: int = 0,
                  ready_file: Path | None = None, torch_threads: int | None = None,
                  stop_timeout_s: float | None = None) -> list[ChildSpec]:
    """The children for this host. `numactl`: its path, or None when it is not installed.
    `torch_threads`: a fixed thread count per child (default: its share of the CPUs).
    `stop_timeout_s`: each child's own bound on its warm shutdown (it may outlive the launcher)."""
    host = host or socket.gethostname()
    allowed = set(cpus if cpus is not None else usable_cpus())
    nodes = {n: [c for c in cs if c in allowed] for n, cs in numa_nodes(sysfs).items()}
    nodes = {n: cs for n, cs in nodes.items() if cs}
    argv = child_argv or [sys.executable, "-m", "workers", "--child", "--variant", variant]
    placements: list[tuple[str, list[int], int | None, dict[str, str]]] = []
    if gpus:
        for i, gpu in enumerate(gpus):
            node = gpu_numa_node(gpu, sysfs)
            node_cpus = nodes.get(node, sorted(allowed)) if node is not None else sorted(allowed)
            per_node = sum(1 for g in gpus if gpu_numa_node(g, sysfs) == node) or 1
            env = {"CUDA_VISIBLE_DEVICES": gpu.uuid or str(gpu.index), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                   "YUE2_DEVICE": "cuda", "YUE2_TORCH_THREADS": str(max(1, len(node_cpus) // per_node))}
            placements.append((f"{variant}-gpu{i}@{host}", node_cpus, node if node in nodes else None, env))
    else:
        order: list[int | None] = [*sorted(nodes)] or [None]
        assigned: dict[int | None, list[int]] = {n: [] for n in order}
        for i in range(procs):
            assigned[order[i % len(order)]].append(i)
        slots: dict[int, tuple[list[int], int | None]] = {}
        for node, children in assigned.items():
            if children:
                pool = nodes[node] if node is not None else sorted(allowed)
                for child, chunk in zip(children, _split(pool, len(children)), strict=True):
                    slots[child] = (chunk, node)
        for i in range(procs):
            chunk, node = slots[i]
            env = {"CUDA_VISIBLE_DEVICES": "", "YUE2_DEVICE": "cpu", "YUE2_TORCH_THREADS": str(len(chunk))}
            placements.append((f"{variant}-cpu{i}@{host}", chunk, node, env))
    specs: list[ChildSpec] = []
    for i, (name, chunk, node, env) in enumerate(placements):
        if torch_threads:
            env["YUE2_TORCH_THREADS"] = str(torch_threads)
        env = {**env, "OMP_NUM_THREADS": env["YUE2_TORCH_THREADS"]}
        if metrics_port:
            env["YUE2_METRICS_PORT"] = str(metrics_port + i)
        if ready_file is not None:
            env["YUE2_WORKER_READY_FILE"] = str(ready_file.with_name(f"{ready_file.name}.{i}"))
        prefix = [numactl, f"--cpunodebind={node}", f"--membind={node}"] if numactl and node is not None else []
        bound = [] if stop_timeout_s is None else ["--stop-timeout", f"{stop_timeout_s:g}"]
        specs.append(ChildSpec(name=name, env=env, cpus=chunk, numa_node=node,
                               argv=[*prefix, *argv, *bound, "--name", name]))
    return specs


def _child_setup(cpus: list[int]) -> Callable[[], None]:
    def setup() -> None:  # runs in the child between fork and exec
        die_with_parent(signal.SIGTERM)  # die with the launcher, even when it is SIGKILLed
        os.sched_setaffinity(0, cpus)

    return setup


@dataclass
class _Running:
    spec: ChildSpec
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    failures: int = 0
    restart_at: float | None = None
    restarts: int = 0


@dataclass
class Supervisor:
    """Runs `children` until a warm shutdown; restarts crashed ones with backoff."""

    children: list[ChildSpec]
    max_backoff_s: float = 60.0
    ready_file: Path | None = None
    poll_s: float = 0.2
    stop_timeout_s: float = WARM.warm_s  # a child's warm shutdown, at most; then SIGKILL
    stop: threading.Event = field(default_factory=threading.Event)
    hurry: threading.Event = field(default_factory=threading.Event)  # a second signal: SIGKILL now
    state: list[_Running] = field(default_factory=list)

    def backoff(self, failures: int) -> float:
        return min(self.max_backoff_s, 2.0 ** (failures - 1))

    def _start(self, run: _Running) -> None:
        env = {**os.environ, **run.spec.env}
        run.proc = subprocess.Popen(run.spec.argv, env=env, preexec_fn=_child_setup(run.spec.cpus))
        run.started = time.monotonic()
        run.restart_at = None
        log.info("started %s (pid %d) on CPUs %s%s", run.spec.name, run.proc.pid, _cpus_text(run.spec.cpus),
                 "" if run.spec.numa_node is None else f", NUMA node {run.spec.numa_node}")

    def stop_on_signals(self) -> None:
        """SIGTERM and SIGINT (Ctrl-C) both start the warm shutdown; a second one cuts it short."""
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def request_stop(self, *_: object) -> None:
        if self.stop.is_set():
            self.hurry.set()
        self.stop.set()

    def run(self) -> int:
        self.state = [_Running(spec) for spec in self.children]
        for run in self.state:
            self._start(run)
        ready_written = False
        while not self.stop.wait(self.poll_s):
            now = time.monotonic()
            for run in self.state:
                if run.proc is not None and run.proc.poll() is not None:
                    code = run.proc.returncode
                    run.failures = 1 if now - run.started >= STABLE_S else run.failures + 1
                    delay = self.backoff(run.failures)
                    log.warning("%s exited with %s; restarting in %.1fs", run.spec.name, code, delay)
                    run.proc, run.restart_at = None, now + delay
                if run.proc is None and run.restart_at is not None and now >= run.restart_at:
                    run.restarts += 1
                    self._start(run)
            if not ready_written and self.ready_file is not None:
                ready_written = self._write_ready()
        return self._shutdown()

    def _write_ready(self) -> bool:
        assert self.ready_file is not None
        files = [self.ready_file.with_name(f"{self.ready_file.name}.{i}") for i in range(len(self.children))]
        if not all(f.exists() for f in files):
            return False
        self.ready_file.write_text(",".join(f.read_text() for f in files))
        return True

    def _shutdown(self) -> int:
        """The warm shutdown: SIGTERM to each child, once (a child that got the signal from its
        process group already is in its warm shutdown, and Celery ignores a repeat); up to
        `stop_timeout_s` for them to exit, less if a second signal comes; SIGKILL to the rest.
        Returns the first failing child's exit status (128 + signal for a killed one), else 0."""
        procs = [r.proc for r in self.state if r.proc is not None and r.proc.poll() is None]
        log.info("warm shutdown: %d worker(s) finish their current batch (up to %.0fs)", len(procs),
                 self.stop_timeout_s)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        # Wakes when the children exit, and every poll_s to see whether a second signal (its
        # handler runs here, between waits) asks for SIGKILL now.
        while not self.hurry.is_set() and time.monotonic() < deadline:
            if wait_exited([p.pid for p in procs], min(deadline, time.monotonic() + self.poll_s)):
                break
        late = [p for p in procs if p.poll() is None]
        if late:
            log.warning("%d worker(s) still running %s: SIGKILL (their jobs run again once their leases lapse)",
                        len(late), "after a second signal" if self.hurry.is_set() else
                        f"{self.stop_timeout_s:.0f}s after SIGTERM")
            for proc in late:
                proc.kill()
            wait_exited([p.pid for p in late], time.monotonic() + KILL_S)
        code = 0
        for proc in procs:  # every child reaped, even after one failed: the launcher outlives them all
            exit_code = proc.wait()
            code = code or (128 - exit_code if exit_code < 0 else exit_code)
        return code


def _cpus_text(cpus: list[int]) -> str:
    return ",".join(map(str, cpus)) if len(cpus) <= 8 else f"{cpus[0]}-{cpus[-1]} ({len(cpus)})"


def launch(*, variant: str, procs: int, metrics_port: int, max_backoff_s: float, ready_file: Path | None,
           torch_threads: int | None = None, host: str | None = None, dry_run: bool = False,
           gpus: list[GpuInfo] | None = None, stop_timeout_s: float = WARM.warm_s) -> int:
    from workers.topology import discover_gpus

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    gpus = discover_gpus() if gpus is None else gpus
    numactl = shutil.which("numactl")
    children = plan_children(variant=variant, gpus=gpus, procs=procs, numactl=numactl, metrics_port=metrics_port,
                             ready_file=ready_file, torch_threads=torch_threads, host=host,
                             stop_timeout_s=stop_timeout_s)
    if dry_run:
        print(json.dumps([c.__dict__ for c in children], indent=2))
        return 0
    if numactl is None and any(c.numa_node is not None for c in children):
        log.warning("numactl is not installed: CPU affinity is set, but memory is not bound to the NUMA node")
    log.info("%d GPU(s); starting %d worker process(es) for %s", len(gpus), len(children), variant)
    sup = Supervisor(children, max_backoff_s=max_backoff_s, ready_file=ready_file, stop_timeout_s=stop_timeout_s)
    sup.stop_on_signals()
    return sup.run()
