"""A worker process's row in `worker_processes`: what it serves and how its last swap went, the
watchdog's swap request to it, its heartbeat. The watchdog, `/healthz`, `yue2 workers` and the
reconciler (a silent row is a dead worker) read it; one process holds a node name at a time.
Beside it, the process's row in `worker_placements` (where it runs: CPUs, device), which outlives
it for the A/B report (`yue2_jobs.experiments.placement`).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from workers.protocol import Runner
from workers.swap import SwapStatus
from yue2_jobs.core.procs import pid_space
from yue2_jobs.db.models import WorkerPlacement, WorkerProcess
from yue2_jobs.db.session import affected, as_utc, utcnow
from yue2_jobs.jobs.capacity import LIVE_WITHIN_S, STARTING


def report(session: Session, *, name: str, runner: Runner, swap: SwapStatus) -> str | None:
    """Write this serving worker's row; returns the watchdog's swap request in it, if any."""
    values = dict(variant=runner.variant, checkpoint=runner.checkpoint, weights_sha256=runner.weights_sha256,
                  pid=os.getpid(), pid_space=pid_space(), swap_version=swap.version,
                  swap_state=None if swap.state is None else str(swap.state), swap_error=swap.error,
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


def swap_request(session: Session, *, name: str) -> str | None:
    """The version the watchdog asked this worker to serve (None: no request)."""
    return session.execute(select(WorkerProcess.swap_request).where(
        WorkerProcess.name == name, WorkerProcess.pid == os.getpid(), WorkerProcess.pid_space == pid_space())).scalar()


def withdraw(session: Session, *, name: str) -> None:
    """Remove this process's row on a clean exit, so the watchdog never waits on a worker that is gone."""
    session.execute(delete(WorkerProcess).where(WorkerProcess.name == name, WorkerProcess.pid == os.getpid(),
                                                WorkerProcess.pid_space == pid_space()))
    session.commit()


def _alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def claim_node_name(session: Session, node: str, *, variant: str) -> None:
    """Take `node` for this process: its row in `worker_processes` gets our pid now, before the model
    loads, so a namesake starting at the same moment (a cloned host booting beside this one) finds
    it taken. Exits if a live process already serves it: releasing its claims would rerun its jobs
    under its feet. Taking the row is a compare-and-set, so of two starters one wins."""
    for _ in range(3):
        row = session.get(WorkerProcess, node, populate_existing=True)
        if row is not None:
            _refuse_if_live(row, node)
        mine = dict(variant=variant, checkpoint=f"{variant}@{STARTING}", weights_sha256=None, pid=os.getpid(),
                    pid_space=pid_space(), swap_version=None, swap_state=None, swap_error=None, swap_request=None,
                    load_error=None, heartbeat_at=utcnow())
        if row is None:
            session.add(WorkerProcess(name=node, **mine))
            try:
                session.commit()
                return
            except IntegrityError:  # another process inserted it first: look again
                session.rollback()
                continue
        took = affected(session.execute(update(WorkerProcess).where(
            WorkerProcess.name == node, WorkerProcess.pid == row.pid,
            WorkerProcess.pid_space.is_not_distinct_from(row.pid_space),
            WorkerProcess.heartbeat_at == row.heartbeat_at).values(**mine)))
        session.commit()
        if took:
            return
    raise SystemExit(f"worker node name {node!r} keeps being taken by another process starting under it")


def _refuse_if_live(row: WorkerProcess, node: str) -> None:
    """Exit if the process of `row` lives. On this host (its pid is in our process table) the pid
    tells; a row another host wrote (two hosts with one hostname, e.g. cloned images) is live while
    it reports."""
    if row.pid_space in (None, pid_space()):  # this host's (None: written before pid spaces were kept)
        if row.pid == os.getpid() or not _alive(row.pid):
            return  # gone: the launcher restarted this name, and what it left is released next
        raise SystemExit(f"worker node name {node!r} is already served by the live process {row.pid}; give each "
                         f"launcher on this host its own --host")
    age = (utcnow() - as_utc(row.heartbeat_at)).total_seconds()
    if age > LIVE_WITHIN_S:
        return  # its host went away; what it left is released next
    raise SystemExit(f"worker node name {node!r} is in use by a worker on another host (pid {row.pid} there, "
                     f"reported {age:.0f}s ago): node names must be unique across hosts; give this host its "
                     f"own hostname, or its launcher --host. (If this host itself restarted within the last "
                     f"{LIVE_WITHIN_S:.0f}s, the name is free once that report is {LIVE_WITHIN_S:.0f}s old.)")


def report_down(session: Session, *, name: str, variant: str, error: str | None) -> None:
    """Refresh this process's row while it loads or is down: its heartbeat, and why it does not
    serve (a worker whose load has failed is not counted as live: `capacity.live_variants`)."""
    now, space = utcnow(), pid_space()
    if not affected(session.execute(update(WorkerProcess).where(
            WorkerProcess.name == name, WorkerProcess.pid == os.getpid(), WorkerProcess.pid_space == space)
            .values(heartbeat_at=now, load_error=error))):
        # reaped as silent meanwhile (a long load): stand again under the name
        session.merge(WorkerProcess(name=name, variant=variant, checkpoint=f"{variant}@{STARTING}", pid=os.getpid(),
                                    pid_space=space, heartbeat_at=now, load_error=error))
    session.commit()


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU's model name, best effort (None off Linux, or on CPUs whose cpuinfo has none, e.g. some ARM)."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "model name" and value.strip():
                return value.strip()[:200]
    except OSError:
        pass
    return None


def _device_of(runner: Runner) -> tuple[str, str | None, str | None]:
    """The runner's device (`cpu` or `cuda:N`), the GPU's name and id: a model runner's decode
    session's device; a font runner has none and runs on the CPU. torch is imported only for a
    CUDA device, which means it is loaded already."""
    device = getattr(getattr(runner, "session", None), "device", None)
    if device is None or getattr(device, "type", "cpu") != "cuda":
        return "cpu", None, None
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    return f"cuda:{index}", torch.cuda.get_device_name(index), None if uuid is None else str(uuid)[:64]


def record_placement(session: Session, *, name: str, runner: Runner) -> WorkerPlacement:
    """Write (or overwrite) where this process runs, as it starts serving: never deleted, so a
    report after the worker is gone still reads it. The CPUs are those it may run on (its affinity:
    the launcher's pinning, a container's cpuset), not the machine's."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    try:
        machine: str | None = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:64] or None
    except OSError:  # not Linux: the hostname is all there is
        machine = None
    device, device_name, device_uuid = _device_of(runner)
    row = session.merge(WorkerPlacement(name=name, host=socket.gethostname()[:200], machine=machine, cpus=cpus,
                                        cpu_count=len(cpus), cpu_model=cpu_model(), device=device,
                                        device_name=device_name, device_uuid=device_uuid, recorded_at=utcnow()))
    session.commit()
    return row
