"""The A/B demo's worker pinning: each arm its own, equal CPUs where there are enough."""

from __future__ import annotations

from yue2_jobs.demo.ab import arm_cpus


def test_each_arm_gets_an_equal_disjoint_share() -> None:
    assert arm_cpus([0, 1], 2) == [[0], [1]]
    assert arm_cpus([7, 2, 3, 4, 5], 2) == [[2, 3], [4, 5]]  # sorted; the odd one left to the API
    assert arm_cpus([0, 1, 2, 3, 4, 5], 3) == [[0, 1], [2, 3], [4, 5]]


def test_too_few_cpus_leaves_the_workers_unpinned() -> None:
    assert arm_cpus([0], 2) == [None, None]
