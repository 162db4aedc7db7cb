"""Worker metrics fold engine counters in without double counting, across a hot swap's new engine, and
listen on loopback unless configured otherwise."""

from __future__ import annotations

import socket
from types import SimpleNamespace

from workers.metrics import WorkerMetrics
from workers.runtime import MetricsServer
from yue2_jobs.core.config import Settings
from yue2_jobs.core.net import free_port
from yue2_jobs.decode.continuous import EngineCounters


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
    default = MetricsServer(WorkerMetrics(worker="w", max_rows=1).registry, port=port, host=Settings().metrics_host)
    default.start()
    assert _listening(port) == ["127.0.0.1"]
    other = free_port()
    configured = MetricsServer(WorkerMetrics(worker="w", max_rows=1).registry, port=other, host="0.0.0.0")
    configured.start()
    assert _listening(other) == ["0.0.0.0"]
    for server in (default, configured):  # the worker's stop closes them (workers.runtime)
        server.signal_stop()
        assert server.join(5)
    assert _listening(port) == _listening(other) == []


def test_graph_capture_and_auto_mode_measurements_are_exported() -> None:
    from yue2_jobs.decode.auto_mode import ModeChooser

    m = WorkerMetrics(worker="w", max_rows=4)
    chooser = ModeChooser(warmup=1)
    chooser.observe("ar", 1, tokens=100, seconds=0.1)
    chooser.observe("hybrid", 1, tokens=100, seconds=0.05)
    runner = SimpleNamespace(graph_count=16, graph_capture_s=2.5, session=SimpleNamespace(chooser=chooser))
    m.runner_loaded(runner)
    m.sample_modes(runner)
    m.sample_modes(SimpleNamespace())  # a font runner: no model, nothing to export
    assert m.graphs.labels("w")._value.get() == 16 and m.graph_capture.labels("w")._value.get() == 2.5
    assert m.mode_speed.labels("w", "1", "hybrid")._value.get() == 2000.0
    assert m.mode_speed.labels("w", "1", "ar")._value.get() == 1000.0


def test_dtype_auto_is_bf16_on_cuda_and_fp32_on_the_cpu() -> None:
    import torch

    from yue2_jobs.model.device import resolve_dtype

    assert resolve_dtype("auto", torch.device("cuda")) is torch.bfloat16
    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32
    assert resolve_dtype("float16", torch.device("cpu")) is torch.float16
