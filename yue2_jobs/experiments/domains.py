"""Which domain each arm of an experiment was trained for, which domain each eval set is of, and
the warning when an arm is scored outside its own.

A checkpoint declares its domain in its manifest, as a note beside `files` (`"domain": "legal"`;
`yue2 train --corpus C` writes C, and the shipped `base` and `legal` say `general` and `legal`);
an experiment records each arm's domain when it is created, from the checkpoint directory the
variant names. An eval set declares its own in its batch's `metadata.domain` (`yue2 ab
export-eval` writes the shipped sets and prints the commands that set it). Either may be missing:
then the report says that it could not check, never that the domains match.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from yue2_jobs.model.checkpoint import read_manifest_notes

MAX_DOMAIN_CHARS = 64


def clean_domain(value: object) -> str | None:
    """A declared domain as compared (trimmed, lower case), or None when none usable is declared."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_DOMAIN_CHARS:
        return None
    return value.strip().lower()


def checkpoint_domain(directory: Path) -> str | None:
    """The domain a checkpoint directory's manifest declares (None: none, or no readable manifest)."""
    try:
        return clean_domain(read_manifest_notes(directory).get("domain"))
    except (OSError, ValueError):  # a directory the API cannot read is the workers' business, not ours
        return None


def arm_domains(variants: list[str], checkpoints: Mapping[str, Path]) -> dict[str, str | None]:
    """Each variant's declared domain, read from the checkpoint directory that serves it."""
    return {v: checkpoint_domain(checkpoints[v]) if v in checkpoints else None for v in variants}


def domain_warnings(*, set_label: str, set_domain: str | None, arms: Mapping[str, str | None]
                    ) -> list[dict[str, str]]:
    """`domain_mismatch` for each arm evaluated on a set of another domain than its checkpoint's;
    `domain_unchecked` for what could not be checked (a set or an arm that declares no domain)."""
    if set_domain is None:
        return [{"kind": "domain_unchecked", "variant": "", "message": (
            f"{set_label} declares no domain (batch metadata.domain), so no arm's domain was checked against it")}]
    out: list[dict[str, str]] = []
    for variant, domain in arms.items():
        if domain is None:
            out.append({"kind": "domain_unchecked", "variant": variant, "message": (
                f"{variant}'s checkpoint declares no domain (manifest `domain`), so it was not checked against "
                f"this {set_domain} set")})
        elif domain != set_domain:
            out.append({"kind": "domain_mismatch", "variant": variant, "message": (
                f"{variant} was trained for {domain} and is evaluated here on {set_label}, a {set_domain} set: "
                f"its scores here measure it outside its domain")})
    return out
