"""The checkpoint registry on SQLite and a local store: publish (manifest last), completeness,
validation (tampered, pickle, NaN weights rejected), activation, one active per variant, rollback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy.exc import IntegrityError

from tests.checkpoints.garbage import retrained_drafter
from yue2_jobs.checkpoints import registry
from yue2_jobs.checkpoints.validate import validate_version
from yue2_jobs.db.models import CheckpointState, CheckpointVersion
from yue2_jobs.errors import ConflictError
from yue2_jobs.model.checkpoint import MANIFEST, load_checkpoint, save_checkpoint, write_manifest

ROOT = Path(__file__).resolve().parents[2]


def copy_of(name: str, dest: Path) -> Path:
    shutil.copytree(ROOT / "checkpoints" / name, dest)
    return dest


def publish(env: Any, directory: Path, variant: str = "legal") -> CheckpointVersion:
    session, store, url, _ = env
    return registry.publish(session, store=store, store_url=url, directory=directory, variant=variant)


def settings_for(tmp: Path, **overrides: Any) -> Any:
    from yue2_jobs.core.config import Settings

    return Settings(home=tmp / "home", checkpoint_cache_dir=tmp / "cache", **overrides)


def validate(env: Any, row: CheckpointVersion, **overrides: Any) -> Path | None:
    """Validation as the watchdog runs it: against the variant's active version (else its shipped directory)."""
    session, store, _, tmp = env
    return validate_version(session, row, store=store, settings=settings_for(tmp, **overrides))


def test_publish_uploads_the_manifest_last_and_registers_a_staged_version(env: Any) -> None:
    _, store, url, _ = env
    row = publish(env, ROOT / "checkpoints" / "legal")
    assert row.state == CheckpointState.STAGED and len(row.version) == 12
    prefix = f"checkpoints/legal/{row.version}/"
    assert store.order[-1] == prefix + MANIFEST and len(store.order) >= 5
    assert row.uri == f"{url}/{prefix}"
    shipped = (ROOT / "checkpoints" / "legal" / "model.safetensors").read_bytes()
    assert shipped == store.get(prefix + "model.safetensors")
    with pytest.raises(ConflictError, match="already published"):
        publish(env, ROOT / "checkpoints" / "legal")


def test_only_versions_with_a_complete_manifest_count(env: Any) -> None:
    _, store, _, _ = env
    row = publish(env, ROOT / "checkpoints" / "legal")
    half = "checkpoints/legal/aaaaaaaaaaaa/"
    store.put(half + "config.json", b"{}")  # a version still uploading: no manifest yet
    broken = "checkpoints/legal/bbbbbbbbbbbb/"
    store.put(broken + MANIFEST, (ROOT / "checkpoints" / "legal" / MANIFEST).read_bytes())  # lists absent files
    assert list(registry.complete_versions(store, "legal")) == [row.version]


def test_a_valid_version_activates_and_rollback_restores_the_previous(env: Any) -> None:
    session = env[0]
    first = publish(env, ROOT / "checkpoints" / "base", variant="base")
    assert validate(env, first) is not None and first.validated_at is not None
    assert registry.activate(session, first) is None
    retrained = retrained_drafter(env[3] / "retrained")  # a new drafter: every `ar` output as before
    second = publish(env, retrained, variant="base")
    assert validate(env, second) is not None
    previous = registry.activate(session, second)
    assert previous is not None and previous.version == first.version
    session.refresh(first)
    assert first.state == CheckpointState.RETIRED and second.state == CheckpointState.ACTIVE
    assert registry.active(session, "base").version == second.version
    back = registry.rollback(session, "base")
    assert back.version == first.version
    session.refresh(second)
    assert registry.active(session, "base").version == first.version and second.state == CheckpointState.RETIRED
    # The database refuses a second active version of a variant, whatever code tries.
    second.state = CheckpointState.ACTIVE
    with pytest.raises(IntegrityError):
        session.commit()
    session.rollback()


def bad_checkpoint(kind: str, dest: Path) -> Path:
    d = copy_of("base", dest)
    if kind == "tampered":  # a weight byte changed after the manifest was written
        data = bytearray((d / "model.safetensors").read_bytes())
        data[-10] ^= 0xFF
        (d / "model.safetensors").write_bytes(bytes(data))
    elif kind == "pickle":
        model, _ = load_checkpoint(d)
        (d / "model.safetensors").unlink()
        torch.save(model.state_dict(), d / "pytorch_model.bin")
        write_manifest(d)
    elif kind == "nan":
        model, tok = load_checkpoint(d)
        with torch.no_grad():
            model.decoder_layers[0].ffn.fc1.weight[0, 0] = float("nan")
        shutil.rmtree(d)
        save_checkpoint(model, tok, d)
    return d


@pytest.mark.parametrize(("kind", "reason"), [
    ("tampered", "CheckpointCorruptError: model.safetensors does not match its sha256"),
    ("pickle", "PickleWeightsRefusedError: refusing pickle weights 'pytorch_model.bin'"),
    ("nan", "CheckpointSmokeTestError: weight decoder_layers.0.ffn.fc1.weight holds NaN or Inf values"),
])
def test_bad_versions_fail_validation_and_the_active_one_stays(env: Any, kind: str, reason: str) -> None:
    session = env[0]
    good = publish(env, retrained_drafter(env[3] / "good"), variant="base")  # the bad ones derive from base's files
    validate(env, good)
    registry.activate(session, good)
    bad = publish(env, bad_checkpoint(kind, env[3] / kind), variant="base")
    assert validate(env, bad) is None
    assert bad.state == CheckpointState.FAILED and bad.error.startswith(reason), bad.error
    with pytest.raises(ConflictError, match="has not passed validation"):
        registry.activate(session, bad)
    assert registry.active(session, "base").version == good.version


@pytest.mark.slow  # runs the `yue2` command in subprocesses
def test_cli_publish_activate_list_history_rollback(tmp_path: Path) -> None:
    env = {**os.environ, "YUE2_HOME": str(tmp_path), "YUE2_DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite'}"}
    env = {k: v for k, v in env.items() if k not in ("YUE2_CHECKPOINT_STORE_URL", "YUE2_CHECKPOINT_CACHE_DIR")}

    def yue2(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "yue2_jobs", *args], capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=300)
        assert (done.returncode == 0) == ok, done.stdout + done.stderr
        return done

    yue2("migrate")
    # base's weights published as legal: valid files, another model. Refused; the shipped legal,
    # registered as legal's first version on the way, stays active.
    refused = yue2("checkpoints", "publish", str(ROOT / "checkpoints" / "base"), "--variant", "legal", "--activate",
                   ok=False)
    assert "registered legal@" in refused.stdout and "as legal's first version (active)" in refused.stdout
    assert "failed validation" in refused.stderr and "strays from the serving version" in refused.stderr
    retrained = retrained_drafter(tmp_path / "retrained", ROOT / "checkpoints" / "legal")
    second = yue2("checkpoints", "publish", str(retrained), "--variant", "legal", "--activate")
    assert "(was " in second.stdout and "agreement 1.00" in second.stdout
    listing = yue2("checkpoints", "list").stdout.splitlines()
    assert [line.split()[1] for line in listing] == ["retired", "failed", "active"], listing
    assert "seed " in listing[0] and "strays from the serving version" in listing[1]
    assert "rolled back" in yue2("checkpoints", "rollback", "legal").stdout
    assert [line.split()[1] for line in yue2("checkpoints", "list", "--variant", "legal").stdout.splitlines()] == \
        ["active", "failed", "retired"]
    history = [line.split() for line in yue2("checkpoints", "history", "--variant", "legal").stdout.splitlines()]
    assert [h[-1] for h in history] == ["seed", "activate", "rollback"] and history[0][0] == history[2][0]
    assert "yue2: error: no checkpoint legal@000000000000" in yue2("checkpoints", "activate", "legal", "000000000000",
                                                                    ok=False).stderr


def test_the_optional_rouge_gate_rejects_a_version_that_forgot_its_task(env: Any, tmp_path: Path) -> None:
    from yue2_jobs.checkpoints.validate import RougeGate
    from yue2_jobs.core.config import Settings

    session, store, _, _ = env
    settings = Settings(home=tmp_path / "home", validation_min_rouge_l={"legal": 30})
    gate = RougeGate.for_variant(settings, "legal")
    assert gate == RougeGate(corpus="legal", minimum=30, items=16)
    assert RougeGate.for_variant(settings, "base") is None  # no minimum set: no gate
    # The minimum alone decides here: an expected change with any drop allowed against the serving version.
    lenient = {"validation_min_rouge_l": {"legal": 30}, "validation_max_rouge_drop": 100.0}
    good = publish(env, ROOT / "checkpoints" / "legal")
    assert validate(env, good, **lenient) is not None
    wrong = registry.publish(session, store=store, store_url=env[2], directory=copy_of("base", tmp_path / "b"),
                             variant="legal", expect_change=True)  # valid weights, the wrong task
    assert validate(env, wrong, **lenient) is None
    assert wrong.state == CheckpointState.FAILED
    assert "ROUGE-L" in wrong.error and "on 16 legal eval items is under the minimum 30.00" in wrong.error, wrong.error
