"""When a busy worker looks for other tenants' waiting jobs (the policy is `jobs.fair_share`)."""

from __future__ import annotations

import logging
import time

from sqlalchemy.orm import Session

from workers.context import WorkerContext
from yue2_jobs.core.retry import transient
from yue2_jobs.jobs.fair_share import jobs_to_share

log = logging.getLogger(__name__)


class FairShare:
    """One micro-batch's looks at the queue: the first after `fair_share_poll_s` (a micro-batch
    shorter than that never looks), then one per poll, while it holds fewer than
    `fair_share_rows` other tenants' jobs. `serving`: the tenants it was handed; `budget`: how many
    jobs it was handed, the most it takes on for others (so a micro-batch at most doubles, and ends).
    The caller asks only while its own jobs are still to start."""

    def __init__(self, ctx: WorkerContext, session: Session, *, serving: set[str], budget: int) -> None:
        self.ctx, self.session, self.serving, self.budget = ctx, session, serving, budget
        self.next_at = time.monotonic() + ctx.settings.fair_share_poll_s
        self.started = 0
        self.taken: set[str] = set()  # the other tenants' jobs this micro-batch claimed

    def due(self) -> list[str]:
        """Ids of other tenants' jobs to claim and start next (empty between polls)."""
        s = self.ctx.settings
        if s.fair_share_rows == 0 or time.monotonic() < self.next_at:
            return []
        self.next_at = time.monotonic() + s.fair_share_poll_s
        with self.ctx.lock:  # still claimed: not recorded yet
            holding = len(self.taken & self.ctx.claims.keys())
        room = min(s.fair_share_rows - holding, self.budget - self.started)
        if room <= 0:
            return []
        try:
            ids = jobs_to_share(self.session, variant=self.ctx.runner.variant, serving=self.serving,
                                share=s.fair_share_rows, limit=room)
        except Exception as exc:  # an outage: the micro-batch goes on with its own jobs
            if not transient(exc):
                raise
            self.session.rollback()
            log.warning("fair share: reading the queue: %s; retrying in %.1fs", type(exc).__name__, s.fair_share_poll_s)
            return []
        if ids:
            self.started += len(ids)
            self.taken.update(ids)
            log.info("fair share: starting %d queued jobs of other tenants ahead of this micro-batch", len(ids))
        return ids
