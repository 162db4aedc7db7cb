"""Worker metrics fold engine counters in without double counting, across a hot swap's new engine, and
listen on loopback unless configured otherwise."""

from __future__ import annotations

import socket
from types import SimpleNamespace

from tests.pipeline.conftest import free_port
from workers.metrics import WorkerMetrics
from yue2_jobs.model.continuous import EngineCounters


def test_engine_counters_fold_in_once_and_survive_a_new_engine() -> None:
    m = WorkerMetrics(worker="w", max_rows=4)
    first = SimpleNamespace(counters=EngineCounters(drafted=50, occupancy=[1, 2, 4]), waiting=[1], live=2)
    m.engine_progress(first)
    m.engine_progress(first)  # nothing new: nothing added
    first.counters.drafted, first.counters.occupancy = 60, [3]
    m.engine_progress(first)
    swapped = SimpleNamespace(counters=EngineCounters(drafted=5, occupancy=[1]), waiting=[], live=1)
    m.engine_progress(swapped)  # a hot swap's engine starts from 0 again
    assert m.drafted.labels("w")._value.get() == 65
    assert m.steps.labels("w")._value.get() == 5
    assert m.queue_depth.labels("w", "engine")._value.get() == 1


def _listening(port: int) -> list[str]:
    """Local addresses listening on `port` (IPv4), from /proc/net/tcp."""
    found = []
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, hex_port = local.split(":")
        if int(hex_port, 16) == port and state == "0A":  # LISTEN
            found.append(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
    return found


def test_metrics_listen_on_loopback_unless_configured() -> None:
    port = free_port()
    WorkerMetrics(worker="w", max_rows=1).serve(port)
    assert _listening(port) == ["127.0.0.1"]
    other = free_port()
    WorkerMetrics(worker="w", max_rows=1).serve(other, host="0.0.0.0")
    assert _listening(other) == ["0.0.0.0"]
