"""The pipeline's settings (`yue2_jobs.core.config`): read from `YUE2_*` variables, validated at
start so a bad one stops a process with its name, never a job later."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from yue2_jobs.core.config import SHIPPED_VARIANTS, Settings, settings_or_exit


@pytest.fixture(autouse=True)
def no_yue2_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees only the variables it sets (a developer's shell may export some)."""
    for name in [n for n in os.environ if n.startswith("YUE2_")]:
        monkeypatch.delenv(name)


def test_settings_are_validated_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="YUE2_DEFAULT_VARIANT"):
        Settings(default_variant="nope")
    with pytest.raises(ValidationError, match="YUE2_VISIBILITY_TIMEOUT_S"):
        Settings(lease_s=3600, visibility_timeout_s=3600)


def test_a_default_length_over_the_limit_is_refused() -> None:
    with pytest.raises(ValidationError, match="YUE2_DEFAULT_MAX_NEW_TOKENS exceeds YUE2_MAX_NEW_TOKENS_LIMIT"):
        Settings(default_max_new_tokens=100, max_new_tokens_limit=64)
    assert Settings(default_max_new_tokens=64, max_new_tokens_limit=64).default_max_new_tokens == 64


def test_variables_are_read_with_their_prefix_and_json_values(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("YUE2_BATCH_MAX_JOBS", "7")
    monkeypatch.setenv("YUE2_WEBHOOK_RETRY_S", "[1, 2.5]")
    monkeypatch.setenv("YUE2_CHECKPOINTS", f'{{"mine": "{tmp_path}"}}')
    monkeypatch.setenv("BATCH_MAX_JOBS", "99")  # no prefix: not ours
    s = Settings()
    assert s.batch_max_jobs == 7 and s.webhook_retry_s == [1.0, 2.5]
    # A named variant is added beside the shipped ones, not instead of them.
    assert s.checkpoints == {**SHIPPED_VARIANTS, "mine": tmp_path}


def test_checkpoints_only_serves_just_the_named_variants(tmp_path: Path) -> None:
    s = Settings(checkpoints={"mine": tmp_path}, checkpoints_only=True, default_variant="mine")
    assert s.checkpoints == {"mine": tmp_path}
    # ... and then the default variant must be one of them.
    with pytest.raises(ValidationError, match="YUE2_DEFAULT_VARIANT='base' is not in YUE2_CHECKPOINTS"):
        Settings(checkpoints={"mine": tmp_path}, checkpoints_only=True)
    # A shipped name replaces the shipped directory.
    replaced = Settings(checkpoints={"base": tmp_path}).checkpoints
    assert replaced == {"base": tmp_path, "legal": SHIPPED_VARIANTS["legal"]}


def test_the_embedded_defaults_live_under_home_and_a_url_given_wins(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = Settings(home=Path("state"))  # relative, as the default `.yue2` is: made absolute where it is read
    home = tmp_path.resolve() / "state"
    assert s.resolved_database_url == f"sqlite:///{home / 'yue2.db'}"
    assert s.resolved_storage_url == (home / "storage").as_uri()
    assert s.resolved_checkpoint_store_url == (home / "checkpoint-store").as_uri()
    assert s.resolved_checkpoint_cache_dir == home / "checkpoint-cache"
    assert s.queue_dir == home / "queue"
    given = Settings(home=tmp_path, database_url="postgresql+psycopg://db/yue2", storage_url="s3://bucket/out")
    assert (given.resolved_database_url, given.resolved_storage_url) == ("postgresql+psycopg://db/yue2",
                                                                          "s3://bucket/out")


def test_out_of_range_values_are_refused_by_name() -> None:
    with pytest.raises(ValidationError, match="batch_max_jobs"):
        Settings(batch_max_jobs=0)
    with pytest.raises(ValidationError, match="dtype"):
        Settings(dtype="float64")


def test_settings_cannot_change_once_built() -> None:
    s = Settings()
    with pytest.raises(ValidationError, match="frozen"):
        s.lease_s = 1.0  # type: ignore[misc]


def test_a_program_with_a_bad_variable_exits_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YUE2_LEASE_S", "-1")
    with pytest.raises(SystemExit) as exit_:
        settings_or_exit("yue2 worker")
    message = str(exit_.value.code)
    assert message.startswith("yue2 worker: invalid configuration:") and "lease_s" in message
    monkeypatch.setenv("YUE2_LEASE_S", "30")
    assert settings_or_exit("yue2 worker").lease_s == 30.0
