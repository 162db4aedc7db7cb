"""The one owner of a worker process's concurrency: every thread and pool besides Celery's own.

A worker process decodes in Celery's pool thread and answers Celery in its main thread. Beside
them run its duties, each a `Service` the `WorkerRuntime` starts and stops in one place:

- `Periodic`: a function every `interval_s` (the lease heartbeat, the metrics sampler, the
  reconciler, ...), with its failure policy in its declaration: an exception of a `quiet` type
  (an outage the duty outlives: the database or Redis away) logs one line, any other a traceback,
  and either way the duty runs again at its next tick. A duty never dies of an exception.
- `Loop`: a function that runs until its stop event is set (the status report); a stop also sets
  its `wake` event, which the loop waits on between rounds, so it ends at once.
- `Pool`: a thread or process pool (the recorder, the uploads), shut down after the threads that
  submit to it; a process pool's helpers exit with this process however it ends.
- `spawn`: a one-shot thread (a hot swap's load, the warm shutdown's bound), joined on stop.
- `MetricsServer`: Prometheus' HTTP server thread, shut down on stop.

Stopping is one call, `WorkerRuntime.stop(timeout_s)`: every thread is told at once and joined in
reverse start order, then the pools are shut down (a thread may still hand them work), all against
one deadline, so `stop` returns within `timeout_s` whatever its services do (one still running
then is named in the log and left; a pool's threads are joined again when the process exits).
Nothing here is started at import or by a constructor.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import select
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

log = logging.getLogger("yue2.worker")


class Service(Protocol):
    name: str

    def start(self) -> None: ...

    def signal_stop(self) -> None:
        """Ask it to stop; returns at once."""
        ...

    def join(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for it to have stopped; whether it has."""
        ...


class _Threaded:
    """A service running `_run` in one daemon thread, stopped by its event."""

    name: str

    def __init__(self, name: str) -> None:
        self.name = name
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"service {self.name} started twice")
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def signal_stop(self) -> None:
        self.stopping.set()

    def join(self, timeout_s: float) -> bool:
        if self._thread is None:
            return True
        self._thread.join(max(0.0, timeout_s))
        return not self._thread.is_alive()


class Periodic(_Threaded):
    """`fn()` every `interval_s` (the first call after one interval). Failure policy: an exception
    of a `quiet` type logs one line, any other its traceback; the next tick runs regardless."""

    def __init__(self, name: str, interval_s: float, fn: Callable[[], object], *,
                 quiet: tuple[type[BaseException], ...] = ()) -> None:
        super().__init__(name)
        self.interval_s, self.fn, self.quiet = interval_s, fn, quiet
        self.failures = 0  # consecutive, for a test or a look in a debugger

    def _run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            self.tick()

    def tick(self) -> None:
        """One run of the duty, under its failure policy."""
        try:
            self.fn()
            self.failures = 0
        except self.quiet as exc:
            self.failures += 1
            log.warning("%s failed (%s: %s); retrying in %.1fs", self.name, type(exc).__name__,
                        " ".join(str(exc).split())[:200], self.interval_s)
        except Exception:
            self.failures += 1
            log.exception("%s failed; retrying in %.1fs", self.name, self.interval_s)


class Loop(_Threaded):
    """`body(stopping)` in a thread, which must return soon after `stopping` is set. `wake`: an
    event the body waits on between rounds; a stop sets it too."""

    def __init__(self, name: str, body: Callable[[threading.Event], None], *,
                 wake: threading.Event | None = None) -> None:
        super().__init__(name)
        self.body, self.wake = body, wake

    def signal_stop(self) -> None:
        super().signal_stop()
        if self.wake is not None:
            self.wake.set()

    def _run(self) -> None:
        try:
            self.body(self.stopping)
        except Exception:  # a loop's body handles its own failures; this one ends the duty: say so loudly
            log.exception("%s stopped on an error", self.name)


class Pool:
    """An executor owned by the runtime, shut down on stop (after the threads that feed it): work
    handed to it before the stop is finished, within the stop's deadline."""

    def __init__(self, name: str, make: Callable[[], Executor]) -> None:
        self.name, self._make = name, make
        self._executor: Executor | None = None
        self._lock = threading.Lock()  # two threads' first submits make one executor
        self._done = threading.Event()

    @property
    def executor(self) -> Executor:
        """The executor, made on first use; a process pool broken by a helper's death is replaced
        (its work in flight has failed with `BrokenExecutor`; the next hands go to new helpers)."""
        with self._lock:
            if self._executor is not None and getattr(self._executor, "_broken", False):
                log.warning("pool %s broke (a helper process died): starting new helpers", self.name)
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None
            if self._executor is None:
                self._executor = self._make()
            return self._executor

    def start(self) -> None:
        pass  # executors start their threads on the first submit

    def signal_stop(self) -> None:
        with self._lock:
            executor = self._executor
        if executor is None:
            self._done.set()
            return

        def shut() -> None:  # shutdown(wait=True) blocks: in its own thread, joined against the deadline
            executor.shutdown(wait=True)
            self._done.set()

        threading.Thread(target=shut, name=f"{self.name}-shutdown", daemon=True).start()

    def join(self, timeout_s: float) -> bool:
        return self._done.wait(max(0.0, timeout_s))


class MetricsServer:
    """Prometheus' HTTP server for `registry` on `host:port`; its socket is closed on stop."""

    def __init__(self, registry: CollectorRegistry, *, port: int, host: str) -> None:
        self.name = "metrics-http"
        self.registry, self.port, self.host = registry, port, host
        self._server: WSGIServer | None = None
        self._closed = threading.Event()

    def start(self) -> None:
        self._server, _ = start_http_server(self.port, addr=self.host, registry=self.registry)

    def signal_stop(self) -> None:
        server = self._server
        if server is None:
            self._closed.set()
            return

        def close() -> None:  # shutdown() waits for serve_forever to return: not in the caller's thread
            server.shutdown()
            server.server_close()
            self._closed.set()

        threading.Thread(target=close, name="metrics-http-shutdown", daemon=True).start()

    def join(self, timeout_s: float) -> bool:
        return self._closed.wait(max(0.0, timeout_s))


class _OneShot(_Threaded):
    def __init__(self, name: str, fn: Callable[[], object]) -> None:
        super().__init__(name)
        self.fn = fn

    def _run(self) -> None:
        try:
            self.fn()
        except Exception:  # its owner reports its own failures; an escape is a bug: loudly
            log.exception("%s failed", self.name)


def _helper_start(parent: int, initializer: Callable[..., object], initargs: tuple[object, ...]) -> None:
    """A helper process's first step: exit with the worker process `parent`, then `initializer`."""
    threading.Thread(target=_exit_with, args=(parent,), name="exit-with-worker", daemon=True).start()
    initializer(*initargs)


def _exit_with(parent: int) -> None:
    """In a helper process: exit as soon as process `parent` has. Not PR_SET_PDEATHSIG: it fires when
    the *thread* that spawned the helper ends (a pool thread, at a warm shutdown), killing a helper
    that may hold its pool's queue lock, and the pool's other helpers then wait on it forever."""
    try:
        fd = os.pidfd_open(parent)  # readable once the process has exited: no polling
    except (OSError, AttributeError):  # not Linux 5.3+: watch for the reparenting instead
        while os.getppid() == parent:
            time.sleep(1.0)
    else:
        select.select([fd], [], [])
    os._exit(1)


class WorkerRuntime:
    """Every service of one worker process, started and stopped here (`add`, `start`, `stop`)."""

    def __init__(self) -> None:
        self._services: list[Service] = []
        self._started: set[int] = set()  # ids of the services started
        self._lock = threading.Lock()
        self.stopped = threading.Event()

    def add(self, service: Service, *, start: bool = False) -> Service:
        """Own `service`; `start`: start it now (a runtime already running starts what it is given)."""
        with self._lock:
            if self.stopped.is_set():
                raise RuntimeError(f"the worker runtime has stopped: cannot add {service.name}")
            self._services.append(service)
        if start:
            self._start(service)
        return service

    def every(self, name: str, interval_s: float, fn: Callable[[], object], *,
              quiet: tuple[type[BaseException], ...] = ()) -> Periodic:
        periodic = Periodic(name, interval_s, fn, quiet=quiet)
        self.add(periodic)
        return periodic

    def loop(self, name: str, body: Callable[[threading.Event], None], *,
             wake: threading.Event | None = None) -> Loop:
        loop = Loop(name, body, wake=wake)
        self.add(loop)
        return loop

    def pool(self, name: str, make: Callable[[], Executor]) -> Pool:
        pool = Pool(name, make)
        self.add(pool)
        return pool

    def thread_pool(self, name: str, workers: int) -> Pool:
        return self.pool(name, lambda: ThreadPoolExecutor(workers, name))

    def process_pool(self, name: str, workers: int, *, initializer: Callable[..., object],
                     initargs: tuple[object, ...]) -> Pool:
        """Spawned (never forked: the parent holds threads and maybe CUDA) helper processes, which
        exit when this process does, however it ends (`_helper_start`)."""
        return self.pool(name, lambda: ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"), initializer=_helper_start,
            initargs=(os.getpid(), initializer, initargs)))

    def spawn(self, name: str, fn: Callable[[], object]) -> None:
        """Run `fn` once in its own thread, now; joined (against the deadline) on stop."""
        self.add(_OneShot(name, fn), start=True)

    def start(self) -> None:
        """Start every service added and not started yet, in the order added."""
        with self._lock:
            services = list(self._services)
        for service in services:
            self._start(service)

    def _start(self, service: Service) -> None:
        with self._lock:
            if id(service) in self._started:
                return
            self._started.add(id(service))
        service.start()

    def stop(self, timeout_s: float) -> list[str]:
        """Tell every service to stop, then wait for them (threads first, then the pools one by one
        in the order added: a thread may still hand a pool work) until one deadline; returns the
        names of those still running."""
        self.stopped.set()
        with self._lock:
            services = list(self._services)
        deadline = time.monotonic() + timeout_s
        threads = [s for s in reversed(services) if not isinstance(s, Pool)]
        pools = [s for s in services if isinstance(s, Pool)]
        for service in threads:
            service.signal_stop()
        late = [s.name for s in threads if not s.join(deadline - time.monotonic())]
        for pool in pools:  # in the order added, one after the other: the recorder feeds the uploads
            pool.signal_stop()
            if not pool.join(deadline - time.monotonic()):
                late.append(pool.name)
        if late:
            log.warning("still running %.1fs after the stop, left to end with the process: %s", timeout_s,
                        ", ".join(late))
        return late

    def names(self) -> list[str]:
        with self._lock:
            return [s.name for s in self._services]
