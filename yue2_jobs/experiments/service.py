"""Creating experiments. How a batch's requests are assigned to an experiment's variants is
`yue2_jobs.jobs.assignment` (batch creation needs it, and jobs imports nothing of experiments).
The first variant listed is the control the others are compared against. Each arm records the
domain its checkpoint's manifest declares (`domains`), for the report's domain warnings.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from yue2_jobs.core.config import Settings
from yue2_jobs.core.ids import new_id
from yue2_jobs.core.safe import check_text
from yue2_jobs.db.models import Experiment, ExperimentMode
from yue2_jobs.db.session import utcnow
from yue2_jobs.errors import InvalidRequestError
from yue2_jobs.experiments.domains import arm_domains
from yue2_jobs.jobs.assignment import get_experiment

__all__ = ["MAX_NAME_CHARS", "MAX_VARIANTS", "create_experiment", "get_experiment"]

MAX_VARIANTS = 8
MAX_NAME_CHARS = 200  # experiments.name


def create_experiment(session: Session, *, tenant: str, name: str, mode: str, variants: list[dict[str, Any]],
                      settings: Settings) -> Experiment:
    """`variants`: [{"variant": name, "weight": w}, ...], control first; weights matter in `split` only."""
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
        # 409, not 422: the body has the documented shape (a JSON Schema cannot say "unique by one
        # property"); its arms clash, as a duplicate name does.
        twice = sorted({n for n in names if names.count(n) > 1})
        raise InvalidRequestError(f"variants name {', '.join(map(repr, twice))} more than once; an experiment "
                                  f"compares different variants", field="variants", status=409,
                                  code="duplicate_variant")
    domains = arm_domains(names, settings.checkpoints)
    exp = Experiment(id=new_id("exp_"), tenant=tenant, name=name, mode=mode, created_at=utcnow(),
                     arms={"variants": [{"variant": v["variant"], "weight": float(v["weight"]),
                                         "domain": domains[v["variant"]]} for v in variants]})
    session.add(exp)
    session.commit()
    return exp
