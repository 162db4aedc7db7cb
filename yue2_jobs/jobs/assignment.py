"""Which variants a batch's requests run on when the batch runs under an A/B experiment.

`split`: each request runs on one variant, chosen by a hash of the experiment id and its
`custom_id` against the variants' weights, so resubmitting the same ids gives the same
assignment. `paired`: each request runs on every variant, so the report can compare them item
by item (a paired difference has far less variance than a difference of two groups).
"""

from __future__ import annotations

import hashlib

from sqlalchemy.orm import Session

from yue2_jobs.db.models import Experiment, ExperimentMode
from yue2_jobs.db.queries import get_owned


def get_experiment(session: Session, *, tenant: str, experiment_id: str) -> Experiment:
    return get_owned(session, Experiment, tenant=tenant, row_id=experiment_id, what="experiment")


def variant_names(exp: Experiment) -> list[str]:
    return [v["variant"] for v in exp.arms["variants"]]


def split_variant(exp: Experiment, custom_id: str) -> str:
    """The variant a `split` experiment gives `custom_id`: a uniform hash point against the weights."""
    digest = hashlib.sha256(f"{exp.id}\x00{custom_id}".encode()).digest()
    point = int.from_bytes(digest[:8], "big") / 2.0**64  # uniform in [0, 1)
    arms = exp.arms["variants"]
    total = sum(a["weight"] for a in arms)
    edge = 0.0
    for arm in arms:
        edge += arm["weight"] / total
        if point < edge:
            return arm["variant"]
    return arms[-1]["variant"]  # rounding at the top edge


def variants_for(exp: Experiment, custom_id: str) -> list[str]:
    """The variants one request of a batch under `exp` runs on."""
    return variant_names(exp) if exp.mode == ExperimentMode.PAIRED else [split_variant(exp, custom_id)]
