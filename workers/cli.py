"""`yue2-worker` (or `python -m workers`): the workers of a host, one process per GPU (or
`--procs` on a CPU host), NUMA-bound and supervised; `--child` is one of those processes."""

from __future__ import annotations

import argparse
import sys

from yue2_jobs.core.config import Settings, settings_or_exit
from yue2_jobs.core.procs import WARM
from yue2_jobs.fonts.params import FONTS_VARIANT

PROG = "yue2-worker"


def check_variant(settings: Settings, variant: str) -> None:
    """A worker serves a configured checkpoint variant, or render jobs."""
    if variant not in settings.checkpoints and variant != FONTS_VARIANT:
        raise SystemExit(f"{PROG}: variant {variant!r} is not in YUE2_CHECKPOINTS "
                         f"({sorted(settings.checkpoints)}) nor {FONTS_VARIANT!r} (render jobs)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--variant", default=None, help="default: YUE2_DEFAULT_VARIANT; `fonts` runs render jobs "
                   "(CPU processes on queue yue2.fonts)")
    p.add_argument("--procs", type=int, default=None, help="processes on a CPU-only host (YUE2_WORKER_PROCS)")
    p.add_argument("--dry-run", action="store_true", help="print each child's CPUs, NUMA node, environment and command")
    p.add_argument("--host", default=None, help="host part of the children's node names (default: this host's "
                   "name); give each launcher on one host its own, e.g. base.$(hostname)")
    p.add_argument("--child", action="store_true", help="be one worker process (what the launcher starts)")
    p.add_argument("--name", default=None, help="Celery node name of a --child (default variant-pid@host)")
    p.add_argument("--no-reconcile", action="store_true", help="do not run the reconciler in this worker")
    p.add_argument("--stop-timeout", type=float, default=WARM.warm_s, metavar="S",
                   help="on SIGTERM/SIGINT each worker process gets S seconds to finish the jobs it has started and "
                   "ack its micro-batch (what it has not started goes back on the queue), then it is SIGKILLed "
                   "(its jobs run again once their leases lapse); a second signal SIGKILLs at once (default "
                   "%(default).0f; a container's stop grace period must exceed it). A --child exits on its own "
                   "after S seconds too")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    settings = settings_or_exit(PROG)
    variant = args.variant or settings.default_variant
    check_variant(settings, variant)
    if args.child:
        from workers.main import run_worker

        run_worker(settings, variant=variant, name=args.name, reconcile=not args.no_reconcile,
                   warm_s=args.stop_timeout)
        return 0
    from workers.launcher import launch

    return launch(variant=variant, procs=args.procs or settings.worker_procs, metrics_port=settings.metrics_port,
                  max_backoff_s=settings.worker_restart_max_s, ready_file=settings.worker_ready_file,
                  torch_threads=settings.torch_threads, host=args.host, dry_run=args.dry_run,
                  gpus=[] if variant == FONTS_VARIANT else None,  # render workers: CPU processes
                  stop_timeout_s=args.stop_timeout)
