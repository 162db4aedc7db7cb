"""Child processes that never outlive the process that started them.

A program that starts workers (the demos, the worker launcher, a worker's upload helpers) must
leave nothing behind however it ends: a SIGTERM or Ctrl-C runs its clean-up (`exit_on_sigterm`
turns SIGTERM into `SystemExit`, so `finally` blocks run as they do for Ctrl-C), and if it is
killed outright the kernel signals its children (`die_with_parent`, Linux's PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

PR_SET_PDEATHSIG = 1


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


def _exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def exit_on_sigterm() -> None:
    """Make SIGTERM end this (main-thread) program the way Ctrl-C does: by an exception, so that
    its `finally` blocks stop its children and remove its temporary files. Python's default is to
    die at once, leaving both behind."""
    signal.signal(signal.SIGTERM, _exit)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """A clean-up that a second Ctrl-C or SIGTERM must not cut short (a half-done clean-up is
    what leaves processes and files behind): both are ignored inside, in the main thread."""
    if threading.current_thread() is not threading.main_thread():  # only it may set handlers
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN), signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])


def stop_all(groups: list[subprocess.Popen[bytes]], *, grace_s: float = 30.0) -> None:
    """Stop children each started as the leader of its own process group (`process_group=0`), with
    everything they started: SIGTERM to each group (a warm shutdown), up to `grace_s` in all for
    the leaders to exit, then SIGKILL to every group still there; returns once every process of
    every group is gone, so nothing they started writes anything afterwards."""
    with shielded():
        for proc in groups:
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in groups:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in groups:
            if _signal_group(proc.pid, 0):  # a leader or its descendants still running
                _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
            gone_by = time.monotonic() + 10.0
            while _signal_group(proc.pid, 0) and time.monotonic() < gone_by:  # SIGKILLed members on their way out
                time.sleep(0.01)


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` (0: none, a probe) to process group `pgid`; False when the group is empty."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # a member that changed user: treated as present
        return True
