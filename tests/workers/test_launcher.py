"""The launcher's plan on fake hosts (sysfs tree + GPU list), and its supervision of real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pipeline.conftest import wait_for
from workers.launcher import ChildSpec, Supervisor, plan_children
from workers.topology import GpuInfo, gpu_numa_node, normalize_bus_id, numa_nodes, parse_cpulist
from yue2_jobs.core.procs import KILL_S


def fake_sysfs(root: Path, nodes: dict[int, str], devices: dict[str, int]) -> Path:
    for node, cpulist in nodes.items():
        d = root / "devices/system/node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
    for bus, node in devices.items():
        d = root / "bus/pci/devices" / bus
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{node}\n")
    return root


def test_parsers() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert normalize_bus_id("00000000:3B:00.0") == "0000:3b:00.0"


def test_two_nodes_four_gpus_each(tmp_path: Path) -> None:
    buses = [f"0000:{b:02x}:00.0" for b in (0x1b, 0x3b, 0x5e, 0x86, 0x9a, 0xb1, 0xd8, 0xdb)]
    sysfs = fake_sysfs(tmp_path, {0: "0-15,64-79", 1: "16-31,80-95"}, {b: (0 if i < 4 else 1) for i, b in
                                                                         enumerate(buses)})
    gpus = [GpuInfo(index=i, pci_bus_id=b, uuid=f"GPU-{i:04d}") for i, b in enumerate(buses)]
    assert [gpu_numa_node(g, sysfs) for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    kids = plan_children(variant="base", gpus=gpus, procs=1, sysfs=sysfs, cpus=list(range(96)), host="h1",
                         numactl="/usr/bin/numactl", metrics_port=9100)
    assert [k.name for k in kids] == [f"base-gpu{i}@h1" for i in range(8)]
    node0, node1 = [*range(0, 16), *range(64, 80)], [*range(16, 32), *range(80, 96)]
    for i, k in enumerate(kids):
        assert k.env["CUDA_VISIBLE_DEVICES"] == f"GPU-{i:04d}"
        assert k.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert k.env["YUE2_DEVICE"] == "cuda"
        assert k.env["YUE2_TORCH_THREADS"] == "8"  # 32 CPUs of the node, 4 GPUs on it
        assert k.env["YUE2_METRICS_PORT"] == str(9100 + i)
        assert k.numa_node == (0 if i < 4 else 1)
        assert k.cpus == (node0 if i < 4 else node1)
        node = k.numa_node
        assert k.argv[:3] == ["/usr/bin/numactl", f"--cpunodebind={node}", f"--membind={node}"]
        assert k.argv[-2:] == ["--name", f"base-gpu{i}@h1"] and "--child" in k.argv


def test_one_node_host_without_numactl(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path, {0: "0-7"}, {"0000:01:00.0": -1, "0000:02:00.0": 0})
    gpus = [GpuInfo(index=0, pci_bus_id="0000:01:00.0"), GpuInfo(index=1, pci_bus_id="0000:02:00.0")]
    kids = plan_children(variant="legal", gpus=gpus, procs=1, sysfs=sysfs, cpus=list(range(8)), host="h",
                         numactl=None)
    assert [k.env["CUDA_VISIBLE_DEVICES"] for k in kids] == ["0", "1"]  # no UUID known: the PCI-ordered index
    assert kids[0].numa_node is None and kids[1].numa_node == 0  # numa_node -1: the kernel does not know
    assert all(k.cpus == list(range(8)) for k in kids)
    assert all(k.argv[0] == sys.executable for k in kids)  # no numactl prefix
    assert "--variant" in kids[0].argv and "legal" in kids[0].argv


def test_workers_of_two_variants_on_one_host_have_distinct_node_names(tmp_path: Path) -> None:
    # One node name for both (cpu0@vm) made them share a worker_processes row and a Flower entry.
    names = {v: [k.name for k in plan_children(variant=v, gpus=[], procs=2, sysfs=tmp_path / "none", cpus=[0, 1],
                                               host="vm", numactl=None)] for v in ("base", "fonts")}
    assert names == {"base": ["base-cpu0@vm", "base-cpu1@vm"], "fonts": ["fonts-cpu0@vm", "fonts-cpu1@vm"]}


def test_cpu_only_hosts_split_the_cores(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path, {0: "0-7", 1: "8-15"}, {})
    kids = plan_children(variant="base", gpus=[], procs=4, sysfs=sysfs, cpus=list(range(16)), host="c",
                         numactl="/usr/bin/numactl")
    assert [k.name for k in kids] == ["base-cpu0@c", "base-cpu1@c", "base-cpu2@c", "base-cpu3@c"]
    assert [k.cpus for k in kids] == [[0, 1, 2, 3], [8, 9, 10, 11], [4, 5, 6, 7], [12, 13, 14, 15]]
    assert [k.numa_node for k in kids] == [0, 1, 0, 1]
    assert all(k.env["CUDA_VISIBLE_DEVICES"] == "" and k.env["YUE2_TORCH_THREADS"] == "4" for k in kids)
    # No NUMA directories at all (a container): the allowed CPUs are split, nothing is bound.
    bare = plan_children(variant="base", gpus=[], procs=3, sysfs=tmp_path / "none", cpus=[0, 1, 2, 3, 4], host="c",
                         numactl="/usr/bin/numactl")
    assert [k.cpus for k in bare] == [[0, 1], [2, 3], [4]]
    assert all(k.numa_node is None and k.argv[0] == sys.executable for k in bare)
    assert numa_nodes(tmp_path / "none") == {}


PROBE = ("import json, os, sys, time; d = os.environ['PROBE_DIR']; tmp = os.path.join(d, f'.{os.getpid()}'); "
         "open(tmp, 'w').write(json.dumps({'name': sys.argv[-1], 'pid': os.getpid(), "
         "'cpus': sorted(os.sched_getaffinity(0)), 'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'), "
         "'threads': os.environ.get('OMP_NUM_THREADS')})); "
         "os.replace(tmp, os.path.join(d, f'{time.time_ns()}-{os.getpid()}.json')); time.sleep(600)")
# A child deep in a micro-batch that will not end soon: SIGTERM and SIGINT change nothing for it.
BUSY_PROBE = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.signal(signal.SIGINT, " \
             "signal.SIG_IGN); " + PROBE


def _records(probe_dir: Path) -> list[dict]:
    """What each child started reported, in start order (one file per child process)."""
    files = sorted(probe_dir.glob("*.json"), key=lambda p: int(p.stem.split("-")[0]))
    return [json.loads(p.read_text()) for p in files]


def _run_supervisor(tmp_path: Path, kids: list[ChildSpec], **kw: float) -> tuple[subprocess.Popen, Path]:
    """The supervisor in its own process (as `yue2 worker` runs it), children printing what they got."""
    out = tmp_path / "children.log"
    script = tmp_path / "sup.py"
    script.write_text(
        "import json, logging, sys\n"
        "from workers.launcher import ChildSpec, Supervisor\n"
        "logging.basicConfig(level=logging.INFO)\n"  # as launch() does
        f"kids = [ChildSpec(**k) for k in json.loads({json.dumps(json.dumps([k.__dict__ for k in kids]))})]\n"
        f"sup = Supervisor(kids, **{kw!r})\n"
        "sup.stop_on_signals()\n"  # what launch() calls
        "sys.exit(sup.run())\n")
    probes = tmp_path / "probes"
    probes.mkdir()
    proc = subprocess.Popen([sys.executable, str(script)], stdout=out.open("wb"), stderr=subprocess.STDOUT,
                            cwd=Path(__file__).resolve().parents[2], env={**os.environ, "PROBE_DIR": str(probes)},
                            process_group=0)  # its own group, as a terminal's job has: a test may signal it all
    return proc, out


def test_children_get_their_affinity_and_environment_and_crashes_restart_with_backoff(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    kids = plan_children(variant="base", gpus=[], procs=2, sysfs=tmp_path / "none", cpus=cpus, host="t",
                         numactl=None, child_argv=[sys.executable, "-c", PROBE])
    proc, out = _run_supervisor(tmp_path, kids, max_backoff_s=1.0)
    probes = tmp_path / "probes"
    try:
        wait_for(lambda: len(_records(probes)) >= 2, timeout=30, what="both children", interval=0.05)
        first = {r["name"]: r for r in _records(probes)}
        for k in kids:
            got = first[k.name]
            assert got["cpus"] == k.cpus, (got, k.cpus)  # sched_setaffinity took effect in the child
            assert got["cuda"] == "" and got["threads"] == str(len(k.cpus))
        # Crash one child: it comes back (new pid, same CPUs) after its backoff; the other is untouched.
        os.kill(first["base-cpu0@t"]["pid"], signal.SIGKILL)
        wait_for(lambda: len(_records(probes)) >= 3, timeout=30, what="the restart", interval=0.05)
        again = _records(probes)[2]
        assert again["name"] == "base-cpu0@t" and again["pid"] != first["base-cpu0@t"]["pid"]
        assert again["cpus"] == first["base-cpu0@t"]["cpus"]
        assert "base-cpu0@t exited with -9; restarting in 1.0s" in out.read_text()
        os.kill(first["base-cpu1@t"]["pid"], 0)  # still alive
        # SIGTERM: children are stopped and the supervisor exits; none is restarted.
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        assert len(_records(probes)) == 3
        for pid in (again["pid"], first["base-cpu1@t"]["pid"]):
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_backoff_doubles_up_to_the_cap() -> None:
    sup = Supervisor([], max_backoff_s=10.0)
    assert [sup.backoff(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_dry_run_prints_the_plan_for_this_host() -> None:
    done = subprocess.run([sys.executable, "-m", "workers", "--dry-run", "--procs", "2", "--host", "h"],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2],
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, timeout=120)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert [c["name"] for c in plan] == ["base-cpu0@h", "base-cpu1@h"]
    assert sorted(c for child in plan for c in child["cpus"]) == sorted(os.sched_getaffinity(0)) or \
        len(os.sched_getaffinity(0)) < 2
    assert all(child["argv"][-2:] == ["--name", child["name"]] for child in plan)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
def test_no_child_outlives_the_launcher(tmp_path: Path, sig: int) -> None:
    """Ctrl-C is a warm shutdown like SIGTERM; a launcher killed outright takes its children with it
    (the kernel sends them SIGTERM: PR_SET_PDEATHSIG)."""
    kids = plan_children(variant="base", gpus=[], procs=2, sysfs=tmp_path / "none",
                         cpus=sorted(os.sched_getaffinity(0)), host="t", numactl=None,
                         child_argv=[sys.executable, "-c", PROBE])
    proc, _ = _run_supervisor(tmp_path, kids, max_backoff_s=1.0)
    try:
        records = wait_for(lambda: len(_records(tmp_path / "probes")) >= 2 and _records(tmp_path / "probes"),
                           timeout=30, what="both children", interval=0.05)
        proc.send_signal(sig)
        proc.wait(30)

        def gone(pid: int) -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"

        for r in records:
            wait_for(lambda pid=r["pid"]: gone(pid), timeout=10, what=f"child {r['name']} to exit")
    finally:
        if proc.poll() is None:
            proc.kill()


def _busy_children(tmp_path: Path, stop_timeout_s: float) -> tuple[subprocess.Popen, Path, list[dict]]:
    kids = plan_children(variant="base", gpus=[], procs=2, sysfs=tmp_path / "none",
                         cpus=sorted(os.sched_getaffinity(0)), host="t", numactl=None,
                         child_argv=[sys.executable, "-c", BUSY_PROBE])
    proc, out = _run_supervisor(tmp_path, kids, max_backoff_s=1.0, stop_timeout_s=stop_timeout_s)
    records = wait_for(lambda: len(_records(tmp_path / "probes")) >= 2 and _records(tmp_path / "probes"),
                       timeout=60, what="both children", interval=0.05)
    return proc, out, records


@pytest.mark.parametrize("group", [False, True], ids=["to-the-launcher", "to-its-group"])
def test_a_warm_shutdown_that_outlasts_the_stop_timeout_ends_in_sigkill(tmp_path: Path, group: bool) -> None:
    """Children that do not finish their micro-batch get `stop_timeout_s` after SIGTERM, then
    SIGKILL: the launcher exits within stop_timeout_s + KILL_S however the signal came."""
    stop_timeout_s = 2.0
    proc, out, records = _busy_children(tmp_path, stop_timeout_s)
    try:
        t0 = time.monotonic()
        if group:  # the children get it too, and the launcher's own SIGTERM after it
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(stop_timeout_s + KILL_S) == 128 + signal.SIGKILL
        assert time.monotonic() - t0 >= stop_timeout_s  # the warm shutdown got its time
        assert "2 worker(s) still running 2s after SIGTERM: SIGKILL" in out.read_text()
        for r in records:  # reaped by the launcher before it exited
            with pytest.raises(ProcessLookupError):
                os.kill(r["pid"], 0)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_second_signal_cuts_the_warm_shutdown_short(tmp_path: Path) -> None:
    """Ctrl-C twice (to the group, as a terminal sends it): SIGKILL at once, not after the timeout."""
    proc, out, records = _busy_children(tmp_path, stop_timeout_s=300.0)
    try:
        os.killpg(proc.pid, signal.SIGINT)
        wait_for(lambda: "warm shutdown: 2 worker(s)" in out.read_text(), timeout=30, what="the warm shutdown")
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(KILL_S)
        assert time.monotonic() - t0 < KILL_S
        assert "2 worker(s) still running after a second signal: SIGKILL" in out.read_text()
        for r in records:
            with pytest.raises(ProcessLookupError):
                os.kill(r["pid"], 0)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
