"""Checkpoint directories: save with a manifest written last, verify before loading.

A checkpoint is a Hugging Face directory (config.json, model.safetensors, tokenizer files,
generation_config.json) plus manifest.json holding the sha256 and size of every other file.
Because the manifest is written last, a reader that verifies it never sees a half-written
checkpoint as valid.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from yue2_jobs.errors import CheckpointCorruptError, CheckpointFileMissingError, PickleWeightsRefusedError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from yue2_jobs.model.modeling_yue2 import Yue2ForConditionalGeneration

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "yue2-manifest/1"
REQUIRED_FILES = ("config.json", "model.safetensors")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_version(manifest_bytes: bytes) -> tuple[str, str]:
    """(version, sha256) of a manifest's bytes: the version is the first 12 hex digits, and it
    names the exact files (weights, config, tokenizer) of a checkpoint."""
    sha = hashlib.sha256(manifest_bytes).hexdigest()
    return sha[:12], sha


def directory_version(directory: str | os.PathLike[str]) -> str:
    """The version of the checkpoint in `directory` ("unversioned" without a manifest)."""
    path = Path(directory) / MANIFEST
    return manifest_version(path.read_bytes())[0] if path.is_file() else "unversioned"


def write_manifest(directory: str | os.PathLike[str], *,
                   notes: dict[str, object] | None = None) -> dict[str, dict[str, object]]:
    """Hash every file under `directory` (except the manifest) and write manifest.json atomically.
    `notes`: more top-level fields saying how the checkpoint was made (`train-drafter` writes
    `drafter`: what it trained from and that the AR weights are byte-identical); loading ignores them."""
    root = Path(directory)
    files = {
        p.relative_to(root).as_posix(): {"sha256": _sha256(p), "size": p.stat().st_size}
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")
    }
    tmp = root / f".{MANIFEST}.tmp"
    body = {**(notes or {}), "format": MANIFEST_FORMAT, "files": files}
    tmp.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, root / MANIFEST)
    return files


def verify_checkpoint_dir(directory: str | os.PathLike[str]) -> dict[str, dict[str, object]]:
    """Check a checkpoint directory against its manifest; raise a CheckpointError naming the file."""
    root = Path(directory)
    if not root.is_dir():
        raise CheckpointFileMissingError(f"checkpoint directory {str(root)!r} does not exist", path=str(root))
    pickles = sorted(p.name for p in root.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise PickleWeightsRefusedError(
            f"refusing pickle weights {pickles[0]!r} in {str(root)!r}: pickle files can run code when "
            "loaded; convert them to model.safetensors", path=str(root / pickles[0]))
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointFileMissingError(f"{MANIFEST} is missing from {str(root)!r}", path=str(manifest_path))
    try:
        manifest = json.loads(manifest_path.read_text())
        files: dict[str, dict[str, object]] = manifest["files"]
        if manifest.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"unknown format {manifest.get('format')!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointCorruptError(f"{MANIFEST} in {str(root)!r} is unreadable: {exc}",
                                     path=str(manifest_path)) from exc
    for name in REQUIRED_FILES:
        if name not in files:
            raise CheckpointCorruptError(f"{MANIFEST} in {str(root)!r} does not list {name}", path=str(root / name))
    unlisted = sorted(p.name for p in root.glob("*.safetensors") if p.name not in files)
    if unlisted:
        raise CheckpointCorruptError(f"weights file {unlisted[0]!r} is not in {MANIFEST}", path=str(root / unlisted[0]))
    for name, entry in files.items():
        path = root / name
        if not path.is_file():
            raise CheckpointFileMissingError(f"{name} is listed in {MANIFEST} but missing from {str(root)!r}",
                                             path=str(path))
        size = path.stat().st_size
        if size != entry.get("size"):
            raise CheckpointCorruptError(f"{name} has {size} bytes, the manifest says {entry.get('size')}",
                                         path=str(path))
        if _sha256(path) != entry.get("sha256"):
            raise CheckpointCorruptError(f"{name} does not match its sha256 in {MANIFEST}", path=str(path))
    return files


@dataclass(frozen=True)
class LoadedCheckpoint:
    model: Yue2ForConditionalGeneration
    tokenizer: PreTrainedTokenizerBase
    files: dict[str, dict[str, object]]  # the verified manifest: name -> sha256 and size

    @property
    def weights_sha256(self) -> str:
        return str(self.files["model.safetensors"]["sha256"])


def load_verified(directory: str | os.PathLike[str]) -> LoadedCheckpoint:
    """Verify a local checkpoint directory against its manifest (each file hashed once), then
    load its model (in eval mode) and tokenizer. Every failure is a CheckpointError naming the
    file; a path that is not a directory is one too, where transformers would take it for a hub
    repository name and fail with a confusing message."""
    files = verify_checkpoint_dir(directory)
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from yue2_jobs.model.modeling_yue2 import register_auto_classes

    register_auto_classes()  # what lets the Auto classes below read `model_type: yue2`

    root = Path(directory)
    return LoadedCheckpoint(AutoModelForSeq2SeqLM.from_pretrained(root).eval(), AutoTokenizer.from_pretrained(root),
                            files)


def load_checkpoint(directory: str | os.PathLike[str]) -> tuple[Yue2ForConditionalGeneration, PreTrainedTokenizerBase]:
    """Model (in eval mode) and tokenizer of a local checkpoint directory, verified first."""
    loaded = load_verified(directory)
    return loaded.model, loaded.tokenizer


def read_manifest_notes(directory: str | os.PathLike[str]) -> dict[str, object]:
    """The manifest's fields besides `format` and `files` (empty without a manifest)."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return {}
    body = json.loads(path.read_text())
    return {k: v for k, v in body.items() if k not in ("format", "files")}


def save_checkpoint(model: Yue2ForConditionalGeneration, tokenizer: PreTrainedTokenizerBase | None,
                    directory: str | os.PathLike[str], *, notes: dict[str, object] | None = None) -> Path:
    """Write tokenizer, weights, config and generation config, then the manifest (with `notes`)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    (root / MANIFEST).unlink(missing_ok=True)  # invalid until rewritten below
    if tokenizer is not None:
        tokenizer.save_pretrained(root)
    model.save_pretrained(root)
    write_manifest(root, notes=notes)  # last: until it exists, the directory is not a valid checkpoint
    return root
