"""When two arms' latencies can be compared: each reason said (one worker for both arms, a worker
without a recorded placement, shared cores or GPU, unequal hardware), and the comparable case."""

from __future__ import annotations

from dataclasses import replace

from yue2_jobs.experiments.placement import Placement, cpu_ranges, host_of, latency_not_comparable

XEON = "Intel(R) Xeon(R) Platinum 8480+"
CPU_A = Placement(host="box", machine="boot-1", cpus=(0, 1, 2, 3), cpu_count=4, cpu_model=XEON, device="cpu")
CPU_B = replace(CPU_A, cpus=(4, 5, 6, 7))
GPU_A = replace(CPU_A, device="cuda:0", device_name="NVIDIA H100 80GB HBM3", device_uuid="GPU-aaa")
GPU_B = replace(CPU_B, device="cuda:0", device_name="NVIDIA H100 80GB HBM3", device_uuid="GPU-bbb")
ARMS = {"base": {"base-cpu0@box"}, "legal": {"legal-cpu0@box"}}


def test_host_of_a_node_name_and_a_cpu_list() -> None:
    assert host_of("base-cpu0@box") == "box" and host_of("a@b@c") == "c"
    assert host_of("base") is None and host_of("@box") is None and host_of("base@") is None
    assert cpu_ranges([3, 0, 1, 2, 8, 10, 11]) == "0-3,8,10-11" and cpu_ranges([5]) == "5" and cpu_ranges([]) == ""


def test_separate_equal_cpu_workers_on_one_machine_compare() -> None:
    assert latency_not_comparable(ARMS, {"base-cpu0@box": CPU_A, "legal-cpu0@box": CPU_B}) is None


def test_separate_equal_gpus_and_separate_equal_hosts_compare() -> None:
    gpus = {"base-gpu0@box": GPU_A, "legal-gpu1@box": replace(GPU_B, device="cuda:1")}
    assert latency_not_comparable({"base": {"base-gpu0@box"}, "legal": {"legal-gpu1@box"}}, gpus) is None
    # one CPU set each, on two machines: overlapping CPU numbers are other cores
    hosts = {"base-cpu0@h1": replace(CPU_A, host="h1", machine="m1"),
             "legal-cpu0@h2": replace(CPU_A, host="h2", machine="m2")}
    assert latency_not_comparable({"base": {"base-cpu0@h1"}, "legal": {"legal-cpu0@h2"}}, hosts) is None


def test_one_worker_serving_both_arms_is_named() -> None:
    why = latency_not_comparable({"base": {"w@box"}, "legal": {"w@box", "legal-1@other"}}, {"w@box": CPU_A})
    assert why is not None and why.startswith("worker w@box ran jobs of both base and legal")


def test_a_worker_without_a_recorded_placement_is_named() -> None:
    why = latency_not_comparable(ARMS, {"base-cpu0@box": CPU_A})
    assert why is not None and why.startswith("worker legal-cpu0@box of legal has no recorded placement")
    assert "has no recorded placement" in (latency_not_comparable(ARMS) or "")  # nothing recorded at all


def test_workers_sharing_cores_are_not_compared() -> None:
    why = latency_not_comparable(ARMS, {"base-cpu0@box": CPU_A, "legal-cpu0@box": replace(CPU_B, cpus=(3, 4, 5, 6))})
    assert why == ("base (base-cpu0@box) and legal (legal-cpu0@box) ran on the same host, box, sharing its CPUs 3: "
                   "the difference measures scheduling, not the models")
    # two containers of one machine: their hostnames differ, their kernel (boot id) is one
    why = latency_not_comparable(ARMS, {"base-cpu0@box": CPU_A, "legal-cpu0@box": replace(CPU_A, host="c2")})
    assert why is not None and "one machine (hosts box and c2, one kernel), sharing its CPUs 0-3" in why


def test_workers_sharing_a_gpu_are_not_compared() -> None:
    # cuda:0 in both processes, but one GPU only where its id says so
    one_gpu = replace(GPU_B, device_uuid="GPU-aaa")
    same = latency_not_comparable(ARMS, {"base-cpu0@box": GPU_A, "legal-cpu0@box": one_gpu})
    assert same is not None and "sharing its GPU NVIDIA H100 80GB HBM3" in same
    assert latency_not_comparable(ARMS, {"base-cpu0@box": GPU_A, "legal-cpu0@box": GPU_B}) is None
    no_ids = {"base-cpu0@box": replace(GPU_A, device_uuid=None), "legal-cpu0@box": replace(GPU_B, device_uuid=None)}
    assert "sharing its GPU" in (latency_not_comparable(ARMS, no_ids) or "")  # by torch's name, cuda:0 both


def test_unequal_hardware_is_not_compared() -> None:
    cases = {"CPU counts": replace(CPU_B, cpus=(4, 5), cpu_count=2),
             "CPU models": replace(CPU_B, cpu_model="AMD EPYC 9654 96-Core Processor"),
             "devices": replace(GPU_B),
             "device models": replace(GPU_B, device_name="NVIDIA A100-SXM4-80GB")}
    for what, other in cases.items():
        mine = GPU_A if what == "device models" else CPU_A
        why = latency_not_comparable(ARMS, {"base-cpu0@box": mine, "legal-cpu0@box": other})
        assert why is not None and f"ran on unequal hardware (different {what})" in why, (what, why)
    why = latency_not_comparable(ARMS, {"base-cpu0@box": CPU_A, "legal-cpu0@box": replace(CPU_B, cpu_count=2)})
    assert why is not None and f"(base-cpu0@box: 4 CPUs of {XEON}, cpu) and legal (legal-cpu0@box: 2 CPUs" in why


def test_the_first_reason_is_said_and_the_records_gaps_too() -> None:
    assert "the jobs of legal do not record" in (latency_not_comparable({"base": {"b@h1"}, "legal": {None}}) or "")
    assert latency_not_comparable({"base": {"b@h1"}, "legal": set()}) == "no job of legal has succeeded here"
    many = latency_not_comparable({"base": {f"b{i}@box" for i in range(5)}, "legal": {"l@box"}})
    assert many is not None and "worker b0@box, b1@box, b2@box and 2 more of base has no recorded placement" in many
