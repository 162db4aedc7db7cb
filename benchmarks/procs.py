"""What the pipeline benchmarks share: waiting on a condition and probing an HTTP server."""

from __future__ import annotations

import signal
import subprocess
import time
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
