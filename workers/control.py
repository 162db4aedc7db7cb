"""What Celery sees of a worker process beyond its task: the remote-control commands of a hot
swap, the consumer step that takes nothing off the queue while a micro-batch runs, and the ready
file written once the worker consumes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from celery import Celery, bootsteps
from celery.signals import task_postrun, task_prerun, worker_ready, worker_shutting_down
from celery.worker.consumer import Consumer
from celery.worker.consumer.tasks import Tasks
from celery.worker.control import control_command

from workers.swap import Answer, HotSwap
from yue2_jobs.queue import TASK_NAME


def install_swap_commands(swap: Callable[[], HotSwap]) -> None:
    """Register `yue2_swap` and `yue2_version` (before the worker starts). `swap`: the worker's
    hot swap (Celery registers commands process-wide, before the worker exists)."""

    # `state` is Celery's own worker state (celery.worker.control), untyped there.
    @control_command(args=[("variant", str), ("version", str)], signature="<variant> <version>")
    def yue2_swap(state: object, variant: str, version: str) -> Answer:
        """Load `variant@version` in the background and serve it from the next group of jobs."""
        return swap().request(variant=variant, version=version)

    @control_command()
    def yue2_version(state: object) -> Answer:
        """What this worker serves, its pid and its last swap."""
        return swap().current()


def take_nothing_while_busy(app: Celery) -> None:
    """While a micro-batch runs (in the pool's thread), the consumer takes no message off the queue,
    as when the batch ran in the main thread: the backlog waits for whichever worker is free, not
    behind this one's batch. An idle worker still takes up to its prefetch window."""
    busy = threading.Event()

    # Celery's signals pass the task as `sender` and more keyword arguments, untyped.
    @task_prerun.connect(weak=False)
    def _started(sender: object = None, **_: object) -> None:
        if getattr(sender, "name", None) == TASK_NAME:
            busy.set()

    @task_postrun.connect(weak=False)
    def _ended(sender: object = None, **_: object) -> None:
        if getattr(sender, "name", None) == TASK_NAME:
            busy.clear()

    class TakeNothingWhileBusy(bootsteps.StartStopStep):
        requires = (Tasks,)  # after the task consumer (re)starts on a (new) connection

        def start(self, c: Consumer) -> None:
            qos = c.task_consumer.channel.qos  # as Celery's worker_disable_prefetch does
            can_consume = qos.can_consume
            qos.can_consume = lambda: not busy.is_set() and can_consume()

    app.steps["consumer"].add(TakeNothingWhileBusy)


def write_when_ready(ready_file: Path, node: str) -> None:
    """`ready_file` holds `node` once the worker consumes (the launcher and the demo wait on it)."""

    @worker_ready.connect(weak=False)
    def _ready(**_: object) -> None:
        ready_file.write_text(node)


def drain_on_shutdown(draining: threading.Event) -> None:
    """When Celery's warm shutdown begins on a signal (SIGTERM, SIGINT: what the launcher and a
    container's stop send): set `draining`, so the micro-batch in progress starts nothing more.
    Celery sends no such signal for a remote `celery control shutdown`: that stop finishes its
    whole micro-batch, unbounded by the worker (the launcher's --stop-timeout still holds)."""

    @worker_shutting_down.connect(weak=False)
    def _shutting_down(**_: object) -> None:
        draining.set()  # only an Event: a signal handler must take no lock another thread may hold
