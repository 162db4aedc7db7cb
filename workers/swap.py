"""Hot swap: a worker serves another version of its variant without a restart.

`HotSwap` holds the serving runner and, while a swap is on its way, the pending one, behind one
lock, and moves through named transitions, each logged and reported (the status row is written
at once):

    request -> loading -> loaded -> serving (adopted)
                       \\-> failed

`request` starts loading in a background thread (a runtime service) and answers at once; the
worker keeps serving the old weights meanwhile. A micro-batch in progress adopts the loaded
runner at its next group boundary (static path) or once the engine's rows in flight have drained
(continuous path: no new rows are admitted meanwhile); an idle worker adopts it under
`batch_gate`, which every micro-batch holds. Results are recorded with the runner that decoded
them, so every job records its version. A load that fails leaves the old runner serving and
reports `failed` (the watchdog marks the version failed) and is not retried for that version.

The watchdog asks through the worker's `worker_processes` row (`swap_request`), which the status
report polls every second, even mid-batch; Celery remote control (`yue2_swap`) does the same for an
operator, and `yue2_version` answers what the worker serves, its pid and the last swap.
"""

from __future__ import annotations

import enum
import gc
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from workers.protocol import Runner

log = logging.getLogger("yue2.swap")

# A remote-control answer (Celery sends it as JSON).
Answer = dict[str, object]


class SwapState(enum.StrEnum):
    """The state of the last swap, as the status row's `swap_state` says it."""

    LOADING = "loading"
    LOADED = "loaded"  # waiting for a point where no job is in flight on the old runner
    SERVING = "serving"  # adopted
    FAILED = "failed"


@dataclass(frozen=True)
class SwapStatus:
    version: str | None = None
    state: SwapState | None = None
    error: str | None = None

    def as_dict(self) -> Answer:
        return {k: (str(v) if isinstance(v, SwapState) else v) for k, v in asdict(self).items()}


class HotSwap:
    """The serving runner and the swap in progress (see the module's docstring).

    `load(version)` builds a runner for `version` (None: this worker cannot swap, e.g. render
    jobs); `spawn(name, fn)` runs `fn` in a thread its owner joins on stop (`WorkerRuntime.spawn`);
    `on_change()` is told after every transition (the worker wakes its status report);
    `on_adopt(runner)` after the switch (metrics)."""

    def __init__(self, runner: Runner, *, load: Callable[[str], Runner] | None,
                 spawn: Callable[[str, Callable[[], None]], None],
                 on_change: Callable[[], None] = lambda: None,
                 on_adopt: Callable[[Runner], None] = lambda runner: None) -> None:
        self._serving = runner
        self._pending: Runner | None = None
        self._status = SwapStatus()
        self._lock = threading.Lock()  # the state, the pending runner, and a request's check-then-start
        self._load, self._on_change, self._on_adopt = load, on_change, on_adopt
        self._spawn = spawn
        # Held by each micro-batch from its first claim to its last record; an idle adoption takes
        # it, so the switch falls between micro-batches.
        self.batch_gate = threading.Lock()

    @property
    def serving(self) -> Runner:
        return self._serving

    @property
    def pending(self) -> bool:
        """Whether a loaded runner waits to be adopted (the decode loop admits nothing new then)."""
        return self._pending is not None

    def status(self) -> SwapStatus:
        return self._status

    def current(self) -> Answer:
        """What this worker serves, its pid and its last swap (`yue2_version`)."""
        runner = self._serving
        return {"checkpoint": runner.checkpoint, "weights_sha256": runner.weights_sha256, "pid": os.getpid(),
                "swap": self._status.as_dict()}

    # -- transitions ---------------------------------------------------------------------------

    def request(self, *, variant: str, version: str) -> Answer:
        """Begin loading `variant@version` in the background unless it is served, loading or has
        failed. The check and the start are one step under the lock: two callers asking at once
        (the status report and remote control) start one load."""
        with self._lock:
            refusal = self._refusal(variant, version)
            if refusal is not None:
                return refusal
            self._move(SwapStatus(version=version, state=SwapState.LOADING))
        try:
            self._spawn("yue2-swap", lambda: self._load_version(version))
        except Exception as exc:  # the worker is stopping, or no thread could start: not loading after all
            with self._lock:
                self._move(replace(self._status, state=SwapState.FAILED, error=f"{type(exc).__name__}: {exc}"))
            return {"failed": self._status.error}
        return {"ok": "loading", **self.current()}

    def _refusal(self, variant: str, version: str) -> Answer | None:
        """Why a request for `variant@version` starts nothing now (None: start it). Under the lock."""
        runner, status = self._serving, self._status
        if variant != runner.variant:
            return {"ignored": f"this worker serves {runner.variant}"}
        if self._load is None:
            return {"ignored": f"{runner.checkpoint} has no versions to swap"}
        if runner.checkpoint == f"{variant}@{version}":
            return {"ok": "already serving", **self.current()}
        if status.state in (SwapState.LOADING, SwapState.LOADED):
            return {"busy": f"still loading {status.version}"}
        if status.state == SwapState.FAILED and status.version == version:
            return {"failed": status.error}  # the watchdog has been told; do not retry in a loop
        return None

    def _load_version(self, version: str) -> None:
        """loading -> loaded (then adopted at once when idle) | failed. The swap thread's body."""
        assert self._load is not None
        old = self._serving
        try:
            new = self._load(version)
        except Exception as exc:  # any failure to load is reported the same way; the old runner serves on
            log.exception("loading %s@%s failed; %s keeps serving", old.variant, version, old.checkpoint)
            with self._lock:
                self._move(replace(self._status, state=SwapState.FAILED, error=f"{type(exc).__name__}: {exc}"))
            return
        with self._lock:
            self._pending = new
            self._move(replace(self._status, state=SwapState.LOADED))
        with self.batch_gate:  # a micro-batch in progress adopts it between two groups of jobs; else here
            self.adopt()

    def adopt(self) -> bool:
        """loaded -> serving: serve the loaded runner from now on, if one waits; whether it switched.
        Called by the decode loop where no job is in flight on the old runner, and by the loader."""
        with self._lock:
            new = self._pending
            if new is None:
                return False
            old, self._serving, self._pending = self._serving, new, None
            self._move(replace(self._status, state=SwapState.SERVING))
        log.info("swapped %s -> %s", old.checkpoint, new.checkpoint)
        self._on_adopt(new)
        del old
        _free_memory()
        return True

    def _move(self, status: SwapStatus) -> None:
        """One transition (under the lock): logged, and reported at once."""
        before = self._status.state
        self._status = status
        log.info("hot swap to %s: %s -> %s%s", status.version, before or "idle", status.state,
                 f" ({status.error})" if status.error else "")
        self._on_change()


def _free_memory() -> None:
    """Give the old runner's memory back (its tensors are unreachable once the caller drops it)."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # freeing cached blocks is best effort
        pass
