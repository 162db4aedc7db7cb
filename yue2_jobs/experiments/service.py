"""Creating experiments and assigning a batch's requests to their variants.

`split`: each request runs on one variant, chosen by a hash of the experiment id and its
`custom_id` against the variants' weights, so resubmitting the same ids gives the same
assignment. `paired`: each request runs on every variant, so the report can compare them item
by item (a paired difference has far less variance than a difference of two groups).
The first variant listed is the control the others are compared against.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from yue2_jobs.core.config import Settings
from yue2_jobs.core.safe import check_text, require_id
from yue2_jobs.db.models import Experiment, ExperimentMode
from yue2_jobs.db.session import utcnow
from yue2_jobs.errors import InvalidRequestError, NotFoundError

MAX_VARIANTS = 8
MAX_NAME_CHARS = 200  # experiments.name


def create_experiment(session: Session, *, tenant: str, name: str, mode: str, variants: list[dict[str, Any]],
                      settings: Settings) -> Experiment:
    """`variants`: [{"variant": name, "weight": w}, ...], control first; weights matter in `split` only."""
    from yue2_jobs.jobs.service import new_id

    check_text(name, field="name", max_chars=MAX_NAME_CHARS)
    if mode not in tuple(ExperimentMode):
        raise InvalidRequestError(f"mode must be one of {[m.value for m in ExperimentMode]}, not {mode!r}",
                                  field="mode")
    if not 2 <= len(variants) <= MAX_VARIANTS:
        raise InvalidRequestError(f"variants must list 2 to {MAX_VARIANTS} variants, not {len(variants)}",
                                  field="variants")
    names = [v["variant"] for v in variants]
    for i, v in enumerate(variants):
        if v["variant"] not in settings.checkpoints:
            raise InvalidRequestError(f"variants[{i}].variant {v['variant']!r} is not served; choose from "
                                      f"{sorted(settings.checkpoints)}", field=f"variants[{i}].variant")
        if not v["weight"] > 0:
            raise InvalidRequestError(f"variants[{i}].weight must be > 0", field=f"variants[{i}].weight")
    if len(set(names)) != len(names):
        raise InvalidRequestError("variants must be different variants", field="variants")
    exp = Experiment(id=new_id("exp_"), tenant=tenant, name=name, mode=mode, created_at=utcnow(),
                     arms={"variants": [{"variant": v["variant"], "weight": float(v["weight"])} for v in variants]})
    session.add(exp)
    session.commit()
    return exp


def get_experiment(session: Session, *, tenant: str, experiment_id: str) -> Experiment:
    require_id(experiment_id, what="experiment")
    exp = session.execute(select(Experiment).where(Experiment.id == experiment_id, Experiment.tenant == tenant)
                          ).scalar_one_or_none()
    if exp is None:
        raise NotFoundError(f"no experiment {experiment_id!r}")
    return exp


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
