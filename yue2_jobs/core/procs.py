"""Child processes that never outlive the process that started them, and stops that take a stated time.

A program that starts workers (the demos, the worker launcher) must leave nothing behind however
it ends: the first SIGTERM or Ctrl-C runs its clean-up
(`stop_once_on_signals` turns it into an exception, so `finally` blocks run, and ignores any
further one, which would cut that clean-up short), and if it is killed outright the kernel signals
its children (`die_with_parent`, Linux's PR_SET_PDEATHSIG). A worker's upload helpers exit with it
by another means (`workers/runtime.py`): they are spawned by a thread, whose end PR_SET_PDEATHSIG
would take for the worker's.

What a stop owes the workers it stops is decided here, once (`Owed`): `WARM` for a launcher's
children (SIGTERM: each finishes and acks its micro-batch, for up to `WORKER_WARM_S`; then SIGKILL),
`NOTHING` for a demo's (SIGKILL at once: their results are thrown away). Cutting a micro-batch
short loses nothing: a killed worker's claims lapse after `YUE2_LEASE_S` and the reconciler reruns
their jobs. A SIGKILLed process is gone within `KILL_S`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

PR_SET_PDEATHSIG = 1

# A worker's warm shutdown (its micro-batch finished, recorded and acked) gets this long after its
# SIGTERM before it is SIGKILLed: long enough for a GPU micro-batch, short enough that a stop is
# a stop. `yue2-worker --stop-timeout` overrides it; a container's stop grace period must exceed
# it (docker-compose.yml gives 10 and 2 minutes).
WORKER_WARM_S = 60.0
# A SIGKILLed process tree is gone (its memory freed, its zombies reaped) within this; measured at
# under 2.5 s for a worker holding a model on a loaded 2-core host.
KILL_S = 10.0


@dataclass(frozen=True)
class Owed:
    """What stopping a worker owes it: `warm_s` seconds after SIGTERM to finish and ack its
    micro-batch before SIGKILL (0: SIGKILL at once). The stop takes at most `bound_s`."""

    warm_s: float

    @property
    def bound_s(self) -> float:
        return self.warm_s + KILL_S


WARM = Owed(WORKER_WARM_S)  # a launcher's children: the work they hold is kept
NOTHING = Owed(0.0)  # a demo's workers: its results are thrown away with its directory


def _libc_prctl() -> Any:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:  # not Linux
        return None


# Resolved here, in the parent: `preexec_fn` runs between fork and exec, where loading a library
# (dlopen) can deadlock on a lock another thread of the parent held at the fork.
_PRCTL = _libc_prctl()


@functools.cache  # fixed for a process's life; asked on every status report and swap poll
def pid_space() -> str:
    """Names the process table this process's pid is a number in: the running kernel (its boot id)
    and the pid namespace. A pid another process wrote means something here only when their spaces
    are equal: one machine, one container. A hostname does not tell (cloned images share one)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:  # not Linux: the host's name is the best there is
        import socket

        return f"host:{socket.gethostname()}"[:80]


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies (even by SIGKILL). For
    `preexec_fn` (between fork and exec) or a pool initializer; a no-op off Linux."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, sig)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_deferred: list[int] = []  # signals that arrived inside `signals_deferred`, raised at its end
_deferring = [0]  # how deep in `signals_deferred` the main thread is


def _stop(signum: int) -> None:
    """The stop, begun once: every later stop signal is ignored (its clean-up must not be cut
    short, and it owes no more than this one), and this one becomes an exception."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def _on_stop_signal(signum: int, _frame: FrameType | None) -> None:
    if _deferring[0]:
        _deferred.append(signum)
        return
    _stop(signum)


def stop_once_on_signals() -> None:
    """Make the first SIGINT (Ctrl-C) or SIGTERM end this (main-thread) program by an exception
    (KeyboardInterrupt, SystemExit(143)), so its `finally` blocks stop its children and remove its
    files, and ignore every later one: a second Ctrl-C, or `make`'s SIGTERM followed by the one
    its death sends (PDEATHSIG), would otherwise land in that clean-up. Python's default for
    SIGTERM is to die at once, leaving both behind."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_stop_signal)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """A step a stop must not land in the middle of (starting a child and taking note of it): a
    stop signal that arrives inside is acted on when the block ends. For `stop_once_on_signals`'
    handlers, in the main thread."""
    _deferring[0] += 1
    try:
        yield
    finally:
        _deferring[0] -= 1
    if _deferred and not _deferring[0]:
        _stop(_deferred.pop(0))


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """A clean-up that a second Ctrl-C or SIGTERM must not cut short (a half-done clean-up is
    what leaves processes and files behind): both are ignored inside, in the main thread."""
    if threading.current_thread() is not threading.main_thread():  # only it may set handlers
        yield
        return
    previous = [signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS]
    try:
        yield
    finally:
        for sig, handler in zip(STOP_SIGNALS, previous, strict=True):
            signal.signal(sig, handler)


def stop_all(groups: list[subprocess.Popen[bytes]], owed: Owed) -> None:
    """Stop children each started as the leader of its own process group (`process_group=0`), with
    everything they started, paying what `owed` says: SIGTERM to each group and up to `warm_s` in
    all for the leaders to exit, then SIGKILL to every group still there. Returns once no process
    of any group runs, within `owed.bound_s`, so nothing they started writes anything afterwards."""
    with shielded():
        if owed.warm_s > 0:
            for proc in groups:
                _signal_group(proc.pid, signal.SIGTERM)
            wait_exited([proc.pid for proc in groups], time.monotonic() + owed.warm_s)
        for proc in groups:
            _signal_group(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + KILL_S
        for proc in groups:
            with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILLed: only a hung kernel is slower
                proc.wait(max(0.0, deadline - time.monotonic()))  # reaps the leader
        while members := _running_members({proc.pid for proc in groups}):  # the rest, reparented to init
            if not wait_exited(members, deadline):
                break


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` (0: none, a probe) to process group `pgid`; False when the group is empty."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # a member that changed user: treated as present
        return True


def _running_members(pgids: set[int]) -> list[int]:
    """The processes of groups `pgids` still running: a zombie (exited, not yet reaped by its
    parent, perhaps init) runs nothing and writes nothing, so it does not count."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # state, ppid, pgrp, ...
        except (OSError, IndexError):  # it exited while we looked
            continue
        if int(fields[2]) in pgids and fields[0] not in ("Z", "X"):
            found.append(int(stat.parent.name))
    return found


def wait_exited(pids: Iterable[int], deadline: float) -> bool:
    """Wait until every process in `pids` has exited (children or not: reaping is their parent's
    business), or until `deadline` (a time.monotonic()); True if they all have. A pidfd becomes
    readable when its process exits, so this wakes then, not at the next poll."""
    pids = list(pids)
    fds: list[int] = []
    try:
        for pid in pids:
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:  # already gone
                continue
            except (AttributeError, OSError):  # no pidfds (not Linux, or a kernel before 5.3)
                return _poll_exited(pids, deadline)
        while fds:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            ready, _, _ = select.select(fds, [], [], remaining)
            for fd in ready:
                fds.remove(fd)
                os.close(fd)
        return True
    finally:
        for fd in fds:
            os.close(fd)


def _poll_exited(pids: list[int], deadline: float) -> bool:
    """`wait_exited` without pidfds: asks every 50 ms (a zombie counts as running here)."""
    while True:
        pids = [pid for pid in pids if _exists(pid)]
        if not pids or time.monotonic() >= deadline:
            return not pids
        time.sleep(0.05)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
