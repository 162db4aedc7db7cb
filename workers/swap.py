"""Hot swap: the watchdog tells a worker (Celery remote control) to serve another version.

`yue2_swap` starts loading the version in a background thread and answers at once; the worker
keeps serving the old weights while it loads. The loaded runner waits in
`WorkerContext.pending_runner`: a micro-batch in progress adopts it at its next group boundary
(static path) or once the engine's rows in flight have drained (continuous path: no new rows are
admitted meanwhile), and an idle worker adopts it under `swap_lock`, which every micro-batch
holds. Results are recorded with the runner that decoded them, so every job records its version. A load that
fails leaves the old runner serving and reports `failed` (the watchdog marks the version failed).
The watchdog asks through the worker's `worker_processes` row (`swap_request`), which the
worker's report thread polls every second, even mid-batch; `yue2_swap` (remote control) does the
same for an operator. `yue2_version` answers what the worker serves, its pid and the last swap.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
from typing import Any

from celery.worker.control import control_command

from yue2_jobs.core.procs import pid_space

log = logging.getLogger("yue2.swap")


def report(session: Any, ctx: Any, *, name: str) -> str | None:
    """Write this worker's row in `worker_processes` (what the watchdog reads); returns the
    watchdog's swap request in it, if any."""
    from yue2_jobs.db.models import WorkerProcess
    from yue2_jobs.db.session import utcnow

    swap = dict(ctx.swap_status)
    values = dict(variant=ctx.runner.variant, checkpoint=ctx.runner.checkpoint,
                  weights_sha256=ctx.runner.weights_sha256, pid=os.getpid(), pid_space=pid_space(),
                  swap_version=swap.get("version"), swap_state=swap.get("state"), swap_error=swap.get("error"),
                  load_error=None, heartbeat_at=utcnow())
    row = session.get(WorkerProcess, name)
    if row is None or (row.pid, row.pid_space) != (os.getpid(), values["pid_space"]):
        # new, or left by an earlier process of this name
        session.merge(WorkerProcess(name=name, swap_request=None, **values))
        request = None
    else:
        for key, value in values.items():
            setattr(row, key, value)
        request = row.swap_request
    session.commit()
    return request


def swap_request(session: Any, *, name: str) -> str | None:
    """The version the watchdog asked this worker to serve (None: no request)."""
    from sqlalchemy import select

    from yue2_jobs.db.models import WorkerProcess

    return session.execute(select(WorkerProcess.swap_request).where(
        WorkerProcess.name == name, WorkerProcess.pid == os.getpid(), WorkerProcess.pid_space == pid_space())).scalar()


def start_swap(ctx: Any, *, variant: str, version: str, directory_for: Any) -> dict[str, Any]:
    """Begin loading `variant@version` in the background unless it is served, loading or failed.
    The check and the start are one step under `swap_start_lock`: two callers asking at once (the
    status-report thread and remote control) start one load."""
    if variant != ctx.runner.variant:
        return {"ignored": f"this worker serves {ctx.runner.variant}"}
    with ctx.swap_start_lock:
        if ctx.runner.checkpoint == f"{variant}@{version}":
            return {"ok": "already serving", **current_status(ctx)}
        state = ctx.swap_status.get("state")
        if state == "loading" or ctx.pending_runner is not None:
            return {"busy": f"still loading {ctx.swap_status.get('version')}"}
        if state == "failed" and ctx.swap_status.get("version") == version:
            return {"failed": ctx.swap_status.get("error")}  # the watchdog has been told; do not retry in a loop
        ctx.swap_status.update(version=version, state="loading", error=None)
        threading.Thread(target=load_and_swap, kwargs={"ctx": ctx, "version": version,
                                                      "directory_for": directory_for},
                         name="yue2-swap", daemon=True).start()
    return {"ok": "loading", **current_status(ctx)}


def withdraw(session: Any, *, name: str) -> None:
    """Remove this process's row on a clean exit, so the watchdog never waits on a worker that is gone."""
    from sqlalchemy import delete

    from yue2_jobs.db.models import WorkerProcess

    session.execute(delete(WorkerProcess).where(WorkerProcess.name == name, WorkerProcess.pid == os.getpid(),
                                                WorkerProcess.pid_space == pid_space()))
    session.commit()


def current_status(ctx: Any) -> dict[str, Any]:
    return {"checkpoint": ctx.runner.checkpoint, "weights_sha256": ctx.runner.weights_sha256, "pid": os.getpid(),
            "swap": dict(ctx.swap_status)}


def load_and_swap(ctx: Any, *, version: str, directory_for: Any) -> None:
    """Build a runner for `version` beside the current one, then switch between micro-batches."""
    old = ctx.runner
    ctx.swap_status.update(version=version, state="loading", error=None)
    try:
        new = type(old)(variant=old.variant, settings=old.settings, directory=directory_for(version))
    except Exception as exc:
        log.exception("loading %s@%s failed; %s keeps serving", old.variant, version, old.checkpoint)
        ctx.swap_status.update(state="failed", error=f"{type(exc).__name__}: {exc}")
        ctx.report_now.set()
        return
    ctx.pending_runner = new  # a micro-batch in progress adopts it between two groups of jobs
    with ctx.swap_lock:  # or, when the worker is idle, here
        adopt_pending(ctx)


def adopt_pending(ctx: Any) -> bool:
    """Serve the loaded runner from now on, if one is waiting; returns whether it switched. Called
    by the decode loop where no job is in flight on the old runner, and by `load_and_swap`."""
    new = ctx.pending_runner
    if new is None:
        return False
    old, ctx.runner, ctx.pending_runner = ctx.runner, new, None
    ctx.swap_status.update(state="serving")
    ctx.report_now.set()
    ctx.metrics.checkpoint_event("swap", new.checkpoint)
    ctx.metrics.runner_loaded(new)
    log.info("swapped %s -> %s", old.checkpoint, new.checkpoint)
    del old
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # freeing cached blocks is best effort
        pass
    return True


def install(ctx_getter: Any, *, directory_for: Any) -> None:
    """Register the remote-control commands (before the worker starts)."""

    @control_command(args=[("variant", str), ("version", str)], signature="<variant> <version>")
    def yue2_swap(state: Any, variant: str, version: str) -> dict[str, Any]:
        """Load `variant@version` in the background and serve it from the next group of jobs."""
        return start_swap(ctx_getter(), variant=variant, version=version, directory_for=directory_for)

    @control_command()
    def yue2_version(state: Any) -> dict[str, Any]:
        """What this worker serves, its pid and its last swap."""
        return current_status(ctx_getter())
