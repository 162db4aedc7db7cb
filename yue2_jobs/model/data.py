"""The two training corpora, built reproducibly from text that pinned packages ship.

- `general`: docstring bodies -> their summary line, from the Python sources of
  transformers 5.24.0 (Apache-2.0), torch 2.13.0 and numpy 2.4.6 (both BSD-3-Clause).
- `legal`: passages of licence texts -> the licence's name and SPDX id, from the SPDX
  licence texts in the `spdx` 2.5.1 package (CC0-1.0 packaging of the SPDX License List).

`python -m yue2_jobs.model.data` (`make data`) writes data/<corpus>/{train,eval}.jsonl.gz
with gzip timestamps zeroed, so a rebuild is byte-identical; data/SHA256SUMS records them.
Eval rows are chosen by a hash of their grouping key, so near-duplicates never straddle
the split.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import importlib.metadata
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

from yue2_jobs.errors import DataError

PINNED_SOURCES = {"transformers": "5.24.0", "torch": "2.13.0", "numpy": "2.4.6", "spdx": "2.5.1"}
CORPORA = ("general", "legal")
EVAL_EVERY = 20  # one group in twenty goes to eval
MAX_EVAL_ROWS = 400
SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|Example usage|Note|Notes|"
    r"Attributes|Inputs|Outputs|Shape|See Also|Warning|Warnings|Keyword Args|Kwargs|Usage)\s*:?\s*$"
    r"|^\s*(>>>|\.\. |```|-{3,}|={3,}|\* |:param|:type|:return|:rtype|:raises|@param|@return)",
)


def _package_root(name: str) -> Path:
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError as exc:
        raise DataError(f"package {name}=={PINNED_SOURCES[name]} is needed to build the data; install it") from exc
    if dist.version.split("+")[0] != PINNED_SOURCES[name]:
        raise DataError(f"data is built from {name}=={PINNED_SOURCES[name]}, found {dist.version}")
    return Path(str(dist.locate_file(name)))


def _squash(text: str) -> str:
    return " ".join(text.split())


def _split_docstring(doc: str) -> tuple[str, str] | None:
    """(summary line, descriptive body) of a docstring, or None when it has no usable pair."""
    paragraphs = re.split(r"\n\s*\n", doc.strip())
    if len(paragraphs) < 2:
        return None
    summary = _squash(paragraphs[0])
    body_lines: list[str] = []
    for line in "\n\n".join(paragraphs[1:]).splitlines():
        if SECTION.match(line):
            break
        body_lines.append(line)
    body = _squash("\n".join(body_lines))
    n_summary, n_body = len(summary.split()), len(body.split())
    if not (3 <= n_summary <= 24 and 8 <= n_body <= 160):
        return None
    if summary.endswith((":", ",")) or "http" in summary or re.search(r"[<>{}\[\]|`]{2,}|Copyright", summary):
        return None
    return summary, body


def iter_general() -> Iterator[dict[str, str]]:
    for package in ("transformers", "torch", "numpy"):
        root = _package_root(package)
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root.parent).as_posix()
            if "/test" in rel or "/_vendor" in rel:
                continue
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for node in ast.walk(tree):
                if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                doc = ast.get_docstring(node)
                pair = doc and _split_docstring(doc)
                if pair:
                    name = getattr(node, "name", "<module>")
                    yield {"source": f"{rel}:{name}", "text": pair[1], "summary": pair[0], "group": pair[0].lower()}


def iter_legal() -> Iterator[dict[str, str]]:
    root = _package_root("spdx") / "data"
    records = json.loads((root / "db.json").read_text(encoding="utf-8"))["licenses"]
    for rec in sorted(records, key=lambda r: r["id"]):
        raw = (root / rec["template"]).read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
        summary = f"{rec['name']} ({rec['id']})" + (", OSI approved" if rec.get("osi_approved") else "")
        chunk: list[str] = []
        for para in [_squash(p) for p in re.split(r"\n\s*\n", text)] + [""]:
            if para:
                chunk.append(para)
            words = sum(len(c.split()) for c in chunk)
            if (not para and chunk) or words >= 60:
                passage = " ".join(chunk)
                chunk = []
                if len(passage.split()) >= 12:
                    words_kept = " ".join(passage.split()[:160])
                    yield {"source": f"spdx/{rec['id']}", "text": words_kept, "summary": summary,
                           "group": words_kept.lower()}


def _is_eval(group: str) -> bool:
    return int(hashlib.sha256(group.encode()).hexdigest()[:8], 16) % EVAL_EVERY == 0


def build_corpus(name: str) -> dict[str, list[dict[str, str]]]:
    rows = iter_general() if name == "general" else iter_legal()
    seen: set[str] = set()
    splits: dict[str, list[dict[str, str]]] = {"train": [], "eval": []}
    for row in rows:
        key = hashlib.sha256((row["text"] + "\0" + row["summary"]).encode()).hexdigest()
        if key in seen or (name == "general" and row["group"] in seen):
            continue
        seen.update((key, row["group"]))
        split = "eval" if _is_eval(row.pop("group")) else "train"
        splits[split].append({"id": f"{name}-{key[:12]}", **row})
    splits["eval"] = splits["eval"][:MAX_EVAL_ROWS]
    if not splits["train"] or not splits["eval"]:
        raise DataError(f"corpus {name!r} came out empty")
    return splits


def _write_jsonl_gz(path: Path, rows: list[dict[str, str]]) -> None:
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


def build_all(data_dir: str | Path) -> dict[str, str]:
    """Build every corpus under `data_dir`; return {relative path: sha256}."""
    root = Path(data_dir)
    sums: dict[str, str] = {}
    for name in CORPORA:
        for split, rows in build_corpus(name).items():
            path = root / name / f"{split}.jsonl.gz"
            _write_jsonl_gz(path, rows)
            sums[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
            print(f"{name}/{split}: {len(rows)} rows")
    (root / "SHA256SUMS").write_text("".join(f"{h}  {p}\n" for p, h in sorted(sums.items())))
    return sums


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the general and legal corpora.")
    parser.add_argument("--out", default="data", help="output directory (default: data)")
    build_all(parser.parse_args(argv).out)


if __name__ == "__main__":
    main()
