"""What the CLI tests share: an environment without the caller's API settings, and a stand-in API
(`stand_in.StandInApi`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cli.stand_in import StandInApi

API_SETTINGS = ("YUE2_API_URL", "YUE2_API_HOST", "YUE2_API_PORT", "YUE2_API_KEY")


@pytest.fixture(autouse=True)
def _no_api_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shell running the tests may have exported these (`eval "$(yue2 stack up)"`)."""
    for name in API_SETTINGS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def stand_in() -> Iterator[StandInApi]:
    api = StandInApi({})
    yield api
    api.server.shutdown()
    api.server.server_close()
