"""A worker's placement record (`worker_placements`): what a starting worker writes of where it
runs, overwritten by its next start and kept after it stops."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy.orm import Session

from tests.workers.fakes import EchoRunner
from workers.status_row import claim_node_name, cpu_model, record_placement, withdraw
from yue2_jobs.db.models import WorkerPlacement, WorkerProcess
from yue2_jobs.experiments.placement import load_placements


def test_a_cpu_worker_records_where_it_runs_and_the_record_outlives_it(session: Session) -> None:
    node = "base-cpu0@placed"
    claim_node_name(session, node, variant="base")
    record_placement(session, name=node, runner=EchoRunner())
    withdraw(session, name=node)  # a clean stop removes the status row, not the placement
    session.expire_all()
    assert session.get(WorkerProcess, node) is None
    row = session.get(WorkerPlacement, node)
    assert row is not None and row.host == socket.gethostname() and row.device == "cpu"
    assert row.cpus == sorted(os.sched_getaffinity(0)) and row.cpu_count == len(row.cpus)
    assert row.cpu_model == cpu_model() and row.device_name is None
    assert row.machine == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    placed = load_placements(session, [node, "never-started@x", None])
    assert set(placed) == {node} and placed[node].cpus == tuple(row.cpus) and placed[node].machine == row.machine


def test_a_restart_overwrites_the_record(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    node = "base-cpu1@placed"
    record_placement(session, name=node, runner=EchoRunner())
    first = session.get(WorkerPlacement, node)
    assert first is not None
    at = first.recorded_at
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # the launcher pinned it to one CPU this time
    record_placement(session, name=node, runner=EchoRunner())
    session.expire_all()
    row = session.get(WorkerPlacement, node)
    assert row is not None and row.cpus == [0] and row.cpu_count == 1 and row.recorded_at >= at
    assert session.query(WorkerPlacement).filter_by(name=node).count() == 1


def test_a_cuda_worker_records_its_gpu(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    runner = EchoRunner()
    runner.session = SimpleNamespace(device=torch.device("cuda"))  # type: ignore[attr-defined]  # a model runner's
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"NVIDIA H100 80GB HBM3 #{i}")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=f"uuid-{i}"))
    record_placement(session, name="base-gpu0@placed", runner=runner)
    row = session.get(WorkerPlacement, "base-gpu0@placed")
    assert row is not None and (row.device, row.device_name, row.device_uuid) == (
        "cuda:1", "NVIDIA H100 80GB HBM3 #1", "uuid-1")


def test_the_cpu_model_is_read_best_effort(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6338\n")
    assert cpu_model(info) == "Intel(R) Xeon(R) Gold 6338"
    info.write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")  # some ARM kernels name no model
    assert cpu_model(info) is None and cpu_model(tmp_path / "absent") is None
