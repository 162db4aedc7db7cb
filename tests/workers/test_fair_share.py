"""A busy worker's looks at other tenants' jobs (`workers.fair_share`): never more at once than its
share, never more in all than the micro-batch's own jobs, so a micro-batch ends (SQLite)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from workers.fair_share import FairShare
from yue2_jobs.core.config import Settings
from yue2_jobs.db.migrate import upgrade_head
from yue2_jobs.db.session import session_factory
from yue2_jobs.jobs import service
from yue2_jobs.storage import LocalStorage


def looks(share: FairShare, n: int) -> list[str]:
    taken: list[str] = []
    for _ in range(n):
        share.next_at = 0.0  # the poll is due
        taken.extend(share.due())
    return taken


def test_other_tenants_get_at_most_their_share_and_the_budget(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_head(url)
    settings = Settings(home=tmp_path, fair_share_rows=2)
    with session_factory(url)() as session:
        waiting = [service.create_job(session, tenant="B", body={"input": f"b {i}"}, settings=settings,
                                      storage=LocalStorage(tmp_path)).id for i in range(10)]
        claims: dict[str, str] = {}
        ctx: Any = SimpleNamespace(settings=settings, lock=threading.Lock(), claims=claims,
                                   runner=SimpleNamespace(variant="base"))
        share = FairShare(ctx, session, serving={"A"}, budget=3)
        first = looks(share, 1)
        assert first == waiting[:2]  # its share at once, B's oldest
        claims.update({j: "token" for j in first})  # claimed, not recorded yet
        assert looks(share, 3) == []  # while it holds them, no more
        claims.clear()  # recorded (here they stay `queued`, so they would come again ...)
        assert len(looks(share, 5)) == 1  # ... but the budget, the micro-batch's 3 own jobs, allows one more
        assert looks(share, 5) == []
