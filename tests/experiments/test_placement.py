"""When two arms' latencies can be compared: never from what the pipeline records today, and each
reason said (one worker, one host, or separate hosts of unrecorded hardware)."""

from __future__ import annotations

from yue2_jobs.experiments.placement import host_of, latency_not_comparable


def test_host_of_a_node_name() -> None:
    assert host_of("base-cpu0@box") == "box" and host_of("a@b@c") == "c"
    assert host_of("base") is None and host_of("@box") is None and host_of("base@") is None


def test_one_worker_serving_both_arms_is_named() -> None:
    why = latency_not_comparable({"base": {"w@box"}, "legal": {"w@box", "legal-1@other"}})
    assert why.startswith("worker w@box ran jobs of both base and legal")


def test_workers_sharing_a_host_are_not_compared() -> None:
    why = latency_not_comparable({"base": {"base-11@box"}, "legal": {"legal-12@box"}})
    assert "base (base-11@box) and legal (legal-12@box) ran on the same host, box, sharing its cores" in why


def test_separate_hosts_are_not_shown_equal() -> None:
    why = latency_not_comparable({"base": {"base-gpu0@h1"}, "legal": {"legal-gpu0@h2"}})
    assert "separate hosts (base on h1; legal on h2)" in why and "equal hardware cannot be shown" in why


def test_unrecorded_workers_and_hosts_are_said() -> None:
    assert "the jobs of legal do not record" in latency_not_comparable({"base": {"b@h1"}, "legal": {None}})
    assert latency_not_comparable({"base": {"b@h1"}, "legal": set()}) == "no job of legal has succeeded here"
    assert "do not name their host" in latency_not_comparable({"base": {"b@h1"}, "legal": {"mine"}})
    many = latency_not_comparable({"base": {f"b{i}@box" for i in range(5)}, "legal": {"l@box"}})
    assert "b0@box, b1@box, b2@box and 2 more" in many
