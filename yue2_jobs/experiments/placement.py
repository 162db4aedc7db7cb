"""Whether two arms' latencies can be compared: only when each arm ran on workers of its own, which
shared no cores and held equal hardware.

A job records the Celery node name of the worker that ran it (`jobs.worker`, `<name>@<host>`);
each worker process records where it runs as it starts serving (`worker_placements`, kept after it
stops): its host and machine (the kernel's boot id, which a machine's containers share), the CPUs
it may run on, their count and model, its device and the device's name and id. The latencies of
two arms compare only when
  (a) no worker ran jobs of both,
  (b) every worker that ran them has its placement recorded,
  (c) the arms' workers shared no cores: on one machine their CPU sets are disjoint, and GPU
      workers hold distinct GPUs,
  (d) the workers are equal: the same CPU count, CPU model, device kind and device name.
Otherwise the report withholds the latency verdict and names the first reason; the latency figures
stay in the tables, as measured. What this cannot see: two virtual machines on one physical host
(separate kernels, shared cores), hyperthread siblings split between the arms, and other load on
the machine while the arms ran. A node name restarted under another placement overwrites its
record, so a report reads where each worker ran last.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from yue2_jobs.db.models import WorkerPlacement

HOST_SEP = "@"


@dataclass(frozen=True)
class Placement:
    """Where one worker process ran (a `worker_placements` row, as the decision reads it)."""

    host: str
    cpus: tuple[int, ...]
    cpu_count: int
    cpu_model: str | None
    device: str  # cpu | cuda:N
    device_name: str | None = None
    machine: str | None = None  # the kernel's boot id (None: not Linux)
    device_uuid: str | None = None

    @property
    def device_kind(self) -> str:
        return self.device.partition(":")[0]

    def same_machine(self, other: Placement) -> bool:
        """By boot id where both have one (containers of one machine have different hostnames)."""
        if self.machine and other.machine:
            return self.machine == other.machine
        return self.host == other.host

    def same_gpu(self, other: Placement) -> bool:
        """Both on one GPU: by its id where both have one (`cuda:0` of two processes with different
        CUDA_VISIBLE_DEVICES are different GPUs), else by the device name torch gave it."""
        if self.device_kind != "cuda" or other.device_kind != "cuda":
            return False
        if self.device_uuid and other.device_uuid:
            return self.device_uuid == other.device_uuid
        return self.device == other.device


def host_of(worker: str) -> str | None:
    """The host part of a Celery node name (None for a name without one)."""
    name, sep, host = worker.rpartition(HOST_SEP)
    return host if sep and name and host else None


def cpu_ranges(cpus: Iterable[int]) -> str:
    """A CPU set as Linux writes a cpulist: `0-3,8,10-11`."""
    out: list[str] = []
    for c in sorted(set(cpus)):
        if out and c == int(out[-1].rpartition("-")[2]) + 1:
            out[-1] = f"{out[-1].partition('-')[0]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)


def _listed(names: Iterable[str], most: int = 3) -> str:
    names = sorted(names)
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _hardware(p: Placement) -> str:
    gpu = f", {p.device_name or p.device}" if p.device_kind != "cpu" else ""
    return f"{p.cpu_count} CPUs of {p.cpu_model or 'unknown model'}, {p.device_kind}{gpu}"


def latency_not_comparable(workers: Mapping[str, set[str | None]],
                           placements: Mapping[str, Placement] | None = None) -> str | None:
    """Why the latencies of these arms (variant -> the workers that ran its succeeded jobs) cannot be
    compared here, given where those workers ran (node name -> placement); None: they can be, every
    condition of the module's docstring holds."""
    placements = placements or {}
    arms = list(workers)
    idle = [v for v in arms if not workers[v]]
    if idle:
        return f"no job of {', '.join(idle)} has succeeded here"
    unknown = [v for v in arms if None in workers[v]]
    if unknown:
        return f"the jobs of {', '.join(unknown)} do not record the worker that ran them"
    named = {v: {w for w in workers[v] if w is not None} for v in arms}
    pairs = [(a, b) for i, a in enumerate(arms) for b in arms[i + 1:]]
    for a, b in pairs:
        shared = named[a] & named[b]
        if shared:
            return (f"worker {_listed(shared)} ran jobs of both {a} and {b}: one process, one set of cores, "
                    f"so the difference measures scheduling, not the models")
    for v in arms:
        unplaced = named[v] - set(placements)
        if unplaced:
            return (f"worker {_listed(unplaced)} of {v} has no recorded placement (a worker records its CPUs "
                    f"and device as it starts serving), so separate, equal hardware cannot be shown")
    for a, b in pairs:
        why = _sharing(a, b, named, placements) or _unequal(a, b, named, placements)
        if why:
            return why
    return None


def _sharing(a: str, b: str, named: Mapping[str, set[str]], placements: Mapping[str, Placement]) -> str | None:
    """Whether a worker of `a` and one of `b` shared cores (or a GPU) on one machine."""
    for wa in sorted(named[a]):
        for wb in sorted(named[b]):
            pa, pb = placements[wa], placements[wb]
            if not pa.same_machine(pb):
                continue
            where = (f"the same host, {pa.host}" if pa.host == pb.host
                     else f"one machine (hosts {pa.host} and {pb.host}, one kernel)")
            both = set(pa.cpus) & set(pb.cpus)
            if both:
                return (f"{a} ({wa}) and {b} ({wb}) ran on {where}, sharing its CPUs {cpu_ranges(both)}: the "
                        f"difference measures scheduling, not the models")
            if pa.same_gpu(pb):
                return (f"{a} ({wa}) and {b} ({wb}) ran on {where}, sharing its GPU {pa.device_name or pa.device}: "
                        f"the difference measures scheduling, not the models")
    return None


def _unequal(a: str, b: str, named: Mapping[str, set[str]], placements: Mapping[str, Placement]) -> str | None:
    """Whether the workers of `a` and `b` held different hardware (any two of them)."""
    for wa in sorted(named[a]):
        for wb in sorted(named[b]):
            pa, pb = placements[wa], placements[wb]
            for what, x, y in (("CPU counts", pa.cpu_count, pb.cpu_count), ("CPU models", pa.cpu_model, pb.cpu_model),
                               ("devices", pa.device_kind, pb.device_kind),
                               ("device models", pa.device_name, pb.device_name)):
                if x != y:
                    return (f"{a} ({wa}: {_hardware(pa)}) and {b} ({wb}: {_hardware(pb)}) ran on unequal "
                            f"hardware (different {what}): the difference measures the hardware, not the models")
    return None


def load_placements(session: Session, names: Iterable[str | None]) -> dict[str, Placement]:
    """The recorded placements of these workers (node name -> placement); a worker without one is left out."""
    wanted = sorted({n for n in names if n is not None})
    out: dict[str, Placement] = {}
    for start in range(0, len(wanted), 500):  # a bounded IN list
        for row in session.execute(select(WorkerPlacement).where(
                WorkerPlacement.name.in_(wanted[start:start + 500]))).scalars():
            out[row.name] = Placement(host=row.host, cpus=tuple(row.cpus), cpu_count=row.cpu_count,
                                      cpu_model=row.cpu_model, device=row.device, device_name=row.device_name,
                                      machine=row.machine, device_uuid=row.device_uuid)
    return out
