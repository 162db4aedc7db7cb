"""`yue2 train-drafter --batch`: a finished batch's input texts, read back from storage with the
parser that admitted them (invalid lines and render jobs left out)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from tests.sqlite_db import sessions  # noqa: F401 - fixture
from yue2_jobs.core.config import Settings
from yue2_jobs.db.models import Batch, BatchStatus
from yue2_jobs.errors import ConflictError, NotFoundError
from yue2_jobs.jobs import files, service
from yue2_jobs.jobs.batch_inputs import iter_batch_texts
from yue2_jobs.storage import LocalStorage

SETTINGS = Settings()


def _line(custom_id: str, body: object) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/summarize", "body": body}) + "\n"


def test_a_finished_batchs_valid_texts_come_back_in_file_order(
        sessions: sessionmaker[Session], tmp_path: Path) -> None:  # noqa: F811
    storage = LocalStorage(tmp_path / "storage")
    data = (_line("a", {"input": "Close the connection pool."}) + _line("bad", {"input": 7})
            + _line("font", {"kind": "render_font", "input": "字"}) + _line("b", {"input": "Parse a TOML file."}))
    with sessions() as session:
        file = files.create_file(session, tenant="t", filename="in.jsonl", purpose="batch", data=data.encode(),
                                 storage=storage)
        batch, _ = service.create_batch(session, tenant="t", input_file_id=file.id, endpoint="/v1/summarize",
                                        completion_window="24h", metadata=None, settings=SETTINGS, storage=storage)
        with pytest.raises(ConflictError, match="train on a batch that has ended"):
            list(iter_batch_texts(session, storage=storage, settings=SETTINGS, batch_id=batch.id))
        session.execute(update(Batch).where(Batch.id == batch.id).values(status=BatchStatus.COMPLETED))
        session.commit()
        texts = list(iter_batch_texts(session, storage=storage, settings=SETTINGS, batch_id=batch.id))
        assert texts == ["Close the connection pool.", "Parse a TOML file."]
        with pytest.raises(NotFoundError, match="no batch"):
            list(iter_batch_texts(session, storage=storage, settings=SETTINGS, batch_id="batch_missing"))
        files.delete_file(session, tenant="t", file_id=file.id, storage=storage)
        with pytest.raises(NotFoundError, match="was deleted"):
            list(iter_batch_texts(session, storage=storage, settings=SETTINGS, batch_id=batch.id))
