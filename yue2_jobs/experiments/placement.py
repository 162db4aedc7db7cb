"""Whether two arms' latencies can be compared: only when each ran on workers of its own, on
hosts of its own, whose hardware the pipeline shows to be equal.

What the pipeline records of where a job ran is `jobs.worker`: the Celery node name of the worker
that claimed it, `<name>@<host>` (`yue2-worker` names its processes `<variant>-cpu<i>@<host>`,
`<variant>-gpu<i>@<host>` or `<variant>-<pid>@<host>`). `worker_processes` adds the pid and the
process table, and only while a worker lives; neither table records how many CPUs or which GPU a
worker held. So two arms whose workers share a node or a host shared its cores (the A/B demo's
two workers share one machine's: a latency difference there measures the scheduler, not the
models), and two arms on separate hosts cannot be shown to have run on equal hardware. Either
way the report withholds the latency verdict and says why; the latency figures stay in the
tables, as measured.
"""

from __future__ import annotations

from collections.abc import Iterable

HOST_SEP = "@"


def host_of(worker: str) -> str | None:
    """The host part of a Celery node name (None for a name without one)."""
    name, sep, host = worker.rpartition(HOST_SEP)
    return host if sep and name and host else None


def _listed(names: Iterable[str], most: int = 3) -> str:
    names = sorted(names)
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def latency_not_comparable(workers: dict[str, set[str | None]]) -> str:
    """Why the latencies of these arms (variant -> the workers that ran its jobs) cannot be compared
    here; every outcome the records allow is one of these reasons (see the module's docstring)."""
    arms = list(workers)
    idle = [v for v in arms if not workers[v]]
    if idle:
        return f"no job of {', '.join(idle)} has succeeded here"
    unknown = [v for v in arms if None in workers[v]]
    if unknown:
        return f"the jobs of {', '.join(unknown)} do not record the worker that ran them"
    named = {v: {w for w in workers[v] if w is not None} for v in arms}
    for i, a in enumerate(arms):
        for b in arms[i + 1:]:
            shared = named[a] & named[b]
            if shared:
                return (f"worker {_listed(shared)} ran jobs of both {a} and {b}: one process, one set of cores, "
                        f"so the difference measures scheduling, not the models")
    hosts = {v: {host_of(w) for w in named[v]} for v in arms}
    unnamed = [v for v in arms if None in hosts[v]]
    if unnamed:
        return f"the workers of {', '.join(unnamed)} do not name their host (a node name without @host)"
    for i, a in enumerate(arms):
        for b in arms[i + 1:]:
            shared_hosts = {h for h in hosts[a] & hosts[b] if h is not None}
            if shared_hosts:
                return (f"{a} ({_listed(named[a])}) and {b} ({_listed(named[b])}) ran on the same host, "
                        f"{_listed(shared_hosts)}, sharing its cores: the difference measures scheduling, "
                        f"not the models")
    spread = "; ".join(f"{v} on {_listed(h for h in hosts[v] if h is not None)}" for v in arms)
    return (f"the arms ran on separate hosts ({spread}), but the pipeline records no CPU count or GPU per "
            f"worker, so equal hardware cannot be shown")
