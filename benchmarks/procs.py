"""What the pipeline benchmarks share: waiting on a condition, probing an HTTP server, and placing
processes on CPUs and counting the CPU time they use (Linux /proc)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def wait_until(condition: Any, timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll `condition` until it returns something truthy; exit naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out waiting for {what}")
        time.sleep(interval)
    return value


def http_up(httpx: Any, url: str) -> bool:
    """Whether `url` answers (any status below 500)."""
    try:
        return bool(httpx.get(url, timeout=2).status_code < 500)
    except httpx.HTTPError:
        return False


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every process, then wait for each (30 s, then SIGKILL)."""
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


# CPU placement and accounting (Linux /proc), for benchmarks that pin processes to cores.

def parse_cpus(text: str) -> list[int]:
    """`0-2,5` -> [0, 1, 2, 5] (the kernel's and taskset's CPU list format)."""
    cpus: set[int] = set()
    for part in text.split(","):
        if part.strip():
            lo, _, hi = part.strip().partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cpus)


def cpus_text(cpus: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> `0-2,5`."""
    out: list[str] = []
    for cpu in sorted(set(cpus)):
        if out and out[-1].split("-")[-1] == str(cpu - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{cpu}"
        else:
            out.append(str(cpu))
    return ",".join(out)


def taskset(cpus: list[int] | None) -> list[str]:
    """The argv prefix that starts a command on `cpus` (none: wherever its parent may run)."""
    return ["taskset", "-c", cpus_text(cpus)] if cpus else []


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | str) -> float | None:
    """User + system CPU seconds process `pid` has used, all its threads (`PID/task/TID`: one
    thread's); None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def children(pid: int) -> list[int]:
    """The live child processes of `pid`."""
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids.extend(int(k) for k in (task / "children").read_text().split())
        except OSError:
            continue
    return kids


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`."""
    out, todo = [], children(pid)
    while todo:
        kid = todo.pop()
        out.append(kid)
        todo.extend(children(kid))
    return out


def threads(pid: int) -> list[int]:
    try:
        return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return []


def listener_pid(port: int) -> int | None:
    """The process on this host with a TCP socket listening on `port` (None: none visible, e.g.
    the service runs elsewhere or in another network namespace). The lowest pid wins, so a
    postmaster is found rather than one of its children."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f[9])
    wanted = {f"socket:[{i}]" for i in inodes}
    for proc in sorted((p for p in Path("/proc").iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
        try:
            if any(os.readlink(fd) in wanted for fd in (proc / "fd").iterdir()):
                return int(proc.name)
        except OSError:
            continue
    return None


def core_times(cpus: Iterable[int]) -> tuple[float, float]:
    """(busy, steal) seconds the kernel has counted on `cpus` since boot (/proc/stat; idle and
    iowait are not busy)."""
    want = {f"cpu{c}" for c in cpus}
    busy = steal = 0
    for line in Path("/proc/stat").read_text().splitlines():
        f = line.split()
        if f and f[0] in want:
            ticks = [int(x) for x in f[1:]]
            busy += sum(ticks) - ticks[3] - ticks[4] - (ticks[8] if len(ticks) > 8 else 0)
            steal += ticks[7] if len(ticks) > 7 else 0
    return busy / _TICK, steal / _TICK


class ServicePinning:
    """Moves already-running services (each a root process and all its descendants, every thread)
    onto `cpus` for the duration of a `with` block, and puts every thread back where it was: the
    ones it moved to their recorded CPUs, processes forked meanwhile (a postmaster's new backends)
    to their root's. The roots are moved first, so that what they fork from then on starts on
    `cpus`."""

    def __init__(self, roots: dict[str, int], cpus: list[int]) -> None:
        self.roots, self.cpus = roots, set(cpus)
        self.saved: dict[int, set[int]] = {}
        self.before: dict[str, str] = {}  # root name -> its CPUs before, for the report

    def __enter__(self) -> ServicePinning:
        for name, root in self.roots.items():
            self.before[name] = cpus_text(os.sched_getaffinity(root))
            for pid in [root, *descendants(root)]:
                for tid in threads(pid):
                    self._move(tid)
        return self

    def _move(self, tid: int) -> None:
        try:
            self.saved.setdefault(tid, os.sched_getaffinity(tid))
            os.sched_setaffinity(tid, self.cpus)
        except OSError:  # gone meanwhile
            self.saved.pop(tid, None)

    def __exit__(self, *_: object) -> None:
        for root in self.roots.values():
            origin = self.saved.get(root)
            for pid in [root, *descendants(root)]:
                for tid in threads(pid):
                    mask = self.saved.get(tid, origin)
                    if mask is not None:
                        try:
                            os.sched_setaffinity(tid, mask)
                        except OSError:
                            continue

    def counts(self) -> dict[str, int]:
        return {name: 1 + len(descendants(root)) for name, root in self.roots.items()}


def run_queue_wait(pid: int, tid: int | None = None) -> float:
    """Seconds the threads of `pid` (those alive now; or its thread `tid`) have spent runnable but
    waiting for a CPU (/proc/PID/task/TID/schedstat): the time other threads took from them."""
    total = 0
    for t in threads(pid) if tid is None else [tid]:
        try:
            total += int(Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()[1])
        except (OSError, IndexError):
            continue
    return total / 1e9


def set_priority(pid: int, nice: int) -> str | None:
    """Give `pid`, started in a session of its own, the nice value `nice` against other sessions
    too: with autogroups on (the default on desktop kernels) a nice value ranks a process only
    within its session's group, and the group's own nice ranks it against the others. Returns
    why not, when it could not."""
    try:
        if Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1":
            Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except OSError as exc:
        return f"autogroup nice {nice} for pid {pid}: {exc}"
    return None
