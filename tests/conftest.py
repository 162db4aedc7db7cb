"""Two markers. `slow`: tests that need the servers (Postgres, Redis, moto), start processes
(workers, the demo, docker compose, a wheel build, network namespaces) or run long model work;
`make test-fast` leaves them out. `servers`: the tests under tests/pipeline, which share Postgres,
Redis and their databases and so run one at a time; `make test` runs everything else spread over
the cores first (each keeps to a database, a Redis database and ports of its own), then these."""

from __future__ import annotations

from pathlib import Path

import pytest

# Every test there talks to a server or starts processes.
SLOW_DIRS = ("pipeline", "benchmarks", "demo", "distributed", "conformance")


SERVER_DIRS = ("pipeline",)  # every test there uses the shared Postgres and Redis


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for item in items:
        rel = Path(str(item.path)).relative_to(tests)
        if rel.parts[0] in SLOW_DIRS:
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
