"""The two corpora, built reproducibly from pinned published text (`sources` has the sources).

- `general`: Debian package descriptions -> their synopsis, and docstring bodies -> their
  summary line from the libraries of the project's environment.
- `legal`: passages of licence texts -> the licence's name and SPDX id.

`python -m yue2_jobs.training.data` (`make data`) writes data/<corpus>/{train,eval,test}.jsonl.gz
with gzip timestamps zeroed, so a rebuild is byte-identical; data/SHA256SUMS records them.
Held-out rows are chosen by a hash of their grouping key, so near-duplicates (a docstring
summary repeated, sibling Debian packages, one licence passage) never straddle splits.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

from yue2_jobs.errors import DataError
from yue2_jobs.training import sources
from yue2_jobs.training.sources import Row

DEFAULT_CACHE = Path(".cache") / "data"
CORPORA = ("general", "legal")
SPLITS = ("train", "eval", "test")
EVAL_EVERY = 20  # one group in twenty goes to eval, another to test
MAX_HELD_OUT_ROWS = 400  # per held-out split, so `make eval` stays fast


def _held_out(group: str) -> str:
    bucket = int(hashlib.sha256(group.encode()).hexdigest()[:8], 16) % EVAL_EVERY
    return {0: "eval", 1: "test"}.get(bucket, "train")


def _rows(name: str, cache: Path, debian_file: Path | None) -> Iterator[Row]:
    if name == "legal":
        yield from sources.iter_legal(cache)
        return
    yield from sources.iter_docstrings(cache)
    yield from sources.iter_debian(debian_file or sources.fetch_debian(cache))


def build_corpus(name: str, *, cache: Path, debian_file: Path | None = None) -> dict[str, list[Row]]:
    seen: set[str] = set()
    splits: dict[str, list[Row]] = {split: [] for split in SPLITS}
    for row in _rows(name, cache, debian_file):
        key = hashlib.sha256((row["text"] + "\0" + row["summary"]).encode()).hexdigest()
        # General rows are unique by target and by input: one input with two targets (a docstring
        # body shared by two functions) would otherwise straddle the splits.
        keys = {key, row.pop("dedupe")} | ({"text:" + row["text"].lower()} if name == "general" else set())
        if keys & seen:
            continue
        seen |= keys
        splits[_held_out(row.pop("group"))].append({"id": f"{name}-{key[:12]}", **row})
    if name == "general":  # two sources one after the other: order by id so every split mixes them
        for rows in splits.values():
            rows.sort(key=lambda r: r["id"])
    for split in ("eval", "test"):
        splits[split] = splits[split][:MAX_HELD_OUT_ROWS]
    if not all(splits.values()):
        raise DataError(f"corpus {name!r} came out with an empty split")
    return splits


def write_jsonl_gz(path: Path, rows: list[Row]) -> None:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="") as gz:
        for row in rows:
            gz.write((json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n").encode())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())


def read_split(data_dir: str | Path, corpus: str, split: str) -> list[dict[str, str]]:
    path = Path(data_dir) / corpus / f"{split}.jsonl.gz"
    if not path.is_file():
        raise DataError(f"{path} is missing; run `make data`")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def build_all(data_dir: str | Path, *, cache: str | Path = DEFAULT_CACHE, debian_file: str | Path | None = None,
              corpora: tuple[str, ...] = CORPORA) -> dict[str, str]:
    """Build `corpora` under `data_dir`; return {relative path: sha256} of the files written."""
    root = Path(data_dir)
    sums: dict[str, str] = {}
    for name in corpora:
        splits = build_corpus(name, cache=Path(cache), debian_file=Path(debian_file) if debian_file else None)
        for split, rows in splits.items():
            path = root / name / f"{split}.jsonl.gz"
            write_jsonl_gz(path, rows)
            sums[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
            print(f"{name}/{split}: {len(rows)} rows")
    if corpora == CORPORA:
        (root / "SHA256SUMS").write_text("".join(f"{h}  {p}\n" for p, h in sorted(sums.items())))
    return sums


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the general and legal corpora.")
    parser.add_argument("--out", default="data", help="output directory (default: data)")
    parser.add_argument("--cache", default=str(DEFAULT_CACHE), help="downloads (default: %(default)s)")
    parser.add_argument("--debian-file", default=None, help="a local copy of the pinned Translation-en.xz")
    args = parser.parse_args(argv)
    build_all(args.out, cache=args.cache, debian_file=args.debian_file)


if __name__ == "__main__":
    main()
