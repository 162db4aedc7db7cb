"""The registry on the real Postgres with versions in S3 (a moto server over HTTP)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from yue2_jobs.checkpoints import registry
from yue2_jobs.checkpoints.validate import validate_version
from yue2_jobs.db.models import CheckpointState
from yue2_jobs.db.session import session_factory
from yue2_jobs.model.checkpoint import MANIFEST
from yue2_jobs.storage import S3Storage

ROOT = Path(__file__).resolve().parents[2]


def test_publish_list_validate_activate_in_s3(settings: Any, s3: dict[str, str], tmp_path: Path) -> None:
    store_url = f"s3://{s3['bucket']}/models"
    store = S3Storage(s3["bucket"], "models", endpoint_url=s3["endpoint"])
    with session_factory(settings.resolved_database_url)() as session:
        row = registry.publish(session, store=store, store_url=store_url, directory=ROOT / "checkpoints" / "legal",
                               variant="legal-s3")
        assert row.uri == f"{store_url}/checkpoints/legal-s3/{row.version}/"
        store.put(f"checkpoints/legal-s3/ffffffffffff/{MANIFEST}", (ROOT / "checkpoints/legal" / MANIFEST).read_bytes())
        assert list(registry.complete_versions(store, "legal-s3")) == [row.version]  # the other lacks its files
        directory = validate_version(session, row, store=store,
                                     settings=settings.model_copy(update={"checkpoint_cache_dir": tmp_path / "cache"}))
        assert directory is not None and (directory / "model.safetensors").read_bytes() == \
            (ROOT / "checkpoints/legal/model.safetensors").read_bytes()
        registry.activate(session, row)
        assert registry.active(session, "legal-s3").state == CheckpointState.ACTIVE
