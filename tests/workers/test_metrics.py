"""Worker metrics fold engine counters in without double counting, across a hot swap's new engine."""

from __future__ import annotations

from types import SimpleNamespace

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
