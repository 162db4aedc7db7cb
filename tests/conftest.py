"""Two markers. `slow`: tests that need the servers (Postgres, Redis, moto), start processes
(workers, the demo, docker compose, a wheel build, network namespaces) or run long model work
(the folders in SLOW_DIRS, and the tests named in LONG_TESTS); `make test-fast` leaves them out.
`servers`: the tests under tests/pipeline, which share the run's Postgres database and Redis server
(tests/pipeline/conftest.py) and so run one at a time; `make test` runs everything else spread
over the cores first (each keeps to a database, a Redis server and ports of its own), then these.
No test writes to a database or Redis server the run did not create (tests/scratch_redis.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The compiled CPU step builds C++ at a worker's start (tens of seconds the first time, then cached):
# workers and sessions the tests start decode eagerly, and tests/decode/test_compiled.py builds its own.
os.environ.setdefault("YUE2_COMPILE", "0")

# Every test there talks to a server or starts processes.
SLOW_DIRS = ("pipeline", "benchmarks", "demo", "distributed", "conformance")


SERVER_DIRS = ("pipeline",)  # every test there uses the session's Postgres database and Redis server

# Tests elsewhere that run long model work or start a process (torch imported anew): each takes
# seconds, and together most of `make test-fast`'s CPU. `make test` runs them; the fast loop keeps
# a cheaper test of each concept (tests/decode's tiny-config tests, tests/checkpoints' quick gates).
LONG_TESTS = frozenset({
    "tests/checkpoints/test_converge.py::test_a_failed_load_marks_the_version_failed_and_reactivates_the_previous",
    "tests/checkpoints/test_converge.py::test_converge_swaps_live_workers_one_by_one_and_skips_gone_ones",
    "tests/checkpoints/test_gates.py::test_a_deployment_with_an_active_version_gets_its_seed_as_the_rollback_target",
    "tests/checkpoints/test_gates.py::test_a_retrained_drafter_passes_and_says_with_what",
    "tests/checkpoints/test_gates.py::test_a_tokenizer_change_must_be_said_and_is_then_judged_on_its_outputs",
    "tests/checkpoints/test_gates.py::test_an_expected_change_is_scored_on_the_eval_set",
    "tests/checkpoints/test_gates.py::test_garbage_is_refused_and_the_serving_version_stays",
    "tests/checkpoints/test_registry.py::test_a_valid_version_activates_and_rollback_restores_the_previous",
    "tests/checkpoints/test_registry.py::test_bad_versions_fail_validation_and_the_active_one_stays",
    "tests/checkpoints/test_registry.py::test_the_optional_rouge_gate_rejects_a_version_that_forgot_its_task",
    "tests/decode/test_continuous.py::test_out_of_memory_splits_the_batch_and_no_job_fails",
    "tests/decode/test_continuous.py::test_same_tokens_as_generate_alone",
    "tests/decode/test_continuous.py::test_token_bound_limits_admission_and_never_starves",
    "tests/decode/test_engine.py::test_engine_equals_the_old_loops_on_a_random_model",
    "tests/decode/test_hybrid.py::test_hybrid_fast_trades_verification_for_steps",
    "tests/decode/test_hybrid.py::test_hybrid_greedy_equals_ar_on_a_random_model",
    "tests/decode/test_hybrid.py::test_nar_with_enough_iterations_is_ar_greedy",
    "tests/decode/test_hybrid.py::test_speculative_sampling_keeps_the_ar_distribution",
    "tests/decode/test_hybrid.py::test_stats_count_every_generated_token",
    "tests/decode/test_layout.py::test_hybrid_equals_ar_in_each_weight_format",
    "tests/experiments/test_report.py::test_segment_report_counts_failures_and_renders_html",
    "tests/experiments/test_report.py::test_the_report_reads_each_difference_by_its_metric_sense",
    "tests/fonts/test_render.py::test_any_text_renders_or_fails_cleanly",
    "tests/jobs/test_streaming.py::test_creating_and_finalizing_a_batch_take_no_more_memory_for_a_bigger_file",
    "tests/model/test_convert_strict.py::test_the_command_refuses_a_yue2_checkpoint_in_one_line",
    "tests/training/test_drafter.py::test_a_drafter_of_another_shape_starts_from_the_ar_branch",
    "tests/training/test_drafter.py::test_a_resume_with_other_inputs_is_refused",
    "tests/training/test_drafter.py::test_a_run_killed_anywhere_resumes_to_the_same_drafter",
    "tests/training/test_drafter.py::test_before_is_the_checkpoints_own_drafter_even_when_restarted",
    "tests/training/test_drafter.py::test_the_ar_weights_stay_byte_identical_and_the_manifest_says_so",
    "tests/training/test_drafter.py::test_the_command_trains_on_a_finished_batchs_inputs",
    "tests/training/test_train.py::test_seeded_runs_are_identical_and_resume_is_exact",
    "tests/training/test_train.py::test_stages_train_only_their_parts",
    "tests/workers/test_long_input.py::test_chunk_gives_one_summary_and_records_chunks",
    "tests/workers/test_runtime.py::test_helper_processes_spawned_by_a_pool_thread_stop_cleanly_and_die_with_the_worker",
})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for item in items:
        rel = Path(str(item.path)).relative_to(tests)
        if rel.parts[0] in SLOW_DIRS or item.nodeid.split("[")[0] in LONG_TESTS:
            item.add_marker(pytest.mark.slow)
        if rel.parts[0] in SERVER_DIRS:
            item.add_marker(pytest.mark.servers)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Figures a passing test reports (`record_property("figures", ...)`): `-q` and xdist hide what
    passing tests print, and some tests' figures are what an issue asks to see."""
    shown = False
    for report in terminalreporter.stats.get("passed", []):
        for name, value in getattr(report, "user_properties", []):
            if name == "figures":
                if not shown:
                    terminalreporter.section("figures")
                    shown = True
                terminalreporter.write_line(f"{report.nodeid}:\n{value}")
