"""The A/B demo's pinning: each arm its own, equal CPUs, and the rest for the API and the client,
only where there are enough for both."""

from __future__ import annotations

from yue2_jobs.demo.ab import CpuPlan, plan_cpus


def test_each_arm_gets_an_equal_disjoint_share_and_one_is_left_for_the_rest() -> None:
    assert plan_cpus([0, 1, 2], 2) == CpuPlan(arms=[[0], [1]], rest=[2])
    assert plan_cpus([7, 2, 3, 4, 5], 2) == CpuPlan(arms=[[2, 3], [4, 5]], rest=[7])  # sorted
    assert plan_cpus([0, 1, 2, 3], 2) == CpuPlan(arms=[[0], [1]], rest=[2, 3])  # equal shares, the odd ones left
    assert plan_cpus(list(range(7)), 3) == CpuPlan(arms=[[0, 1], [2, 3], [4, 5]], rest=[6])


def test_arms_and_rest_never_share_a_cpu() -> None:
    for n in range(3, 17):
        plan = plan_cpus(list(range(n)), 2)
        cpus = [c for arm in plan.arms if arm for c in arm] + (plan.rest or [])
        assert sorted(cpus) == list(range(n)), n
        assert plan.rest and len({len(arm or []) for arm in plan.arms}) == 1, n


def test_no_cpu_left_for_the_api_leaves_everything_unpinned() -> None:
    # Two cores, two arms: one core each would leave the API and the client on the arms' cores,
    # the placement check passing while latency measures scheduling; so nothing is pinned and the
    # report says the arms shared cores.
    assert plan_cpus([0, 1], 2) == CpuPlan(arms=[None, None], rest=None)
    assert plan_cpus([0], 2) == CpuPlan(arms=[None, None], rest=None)
    assert plan_cpus([0, 1, 2, 3, 4, 5], 3) == CpuPlan(arms=[[0], [1], [2]], rest=[3, 4, 5])
