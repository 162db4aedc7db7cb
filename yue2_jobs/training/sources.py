"""Where the corpora's rows come from: pinned, published text that someone else wrote.

- Debian's package descriptions (bookworm main, `Translation-en`): each package's long
  description -> its one-line synopsis. The file is fetched once from deb.debian.org and
  checked against the sha256 that bookworm's signed `InRelease` lists for it.
- Docstrings of the Python libraries in the project's environment, at pinned versions:
  docstring body -> its summary line. Sources are parsed, never imported, so a library whose
  installed version differs is fetched with `pip install --no-deps` into a cache instead.
- The SPDX licence texts in the `spdx` package: passage -> "Licence name (SPDX-ID)".

Each iterator yields {"source", "text", "summary", "group", "dedupe"}: `group` decides the
split (rows sharing it land in the same split), `dedupe` drops repeats.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
import lzma
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from yue2_jobs.errors import DataError

# bookworm main, Debian 12.15 (InRelease of 2026-07-11); the sha256 is the one InRelease lists.
DEBIAN_URL = "http://deb.debian.org/debian/dists/bookworm/main/i18n/Translation-en.xz"
DEBIAN_SHA256 = "a3d4a0bfd8e9242810b0885eda7c1a6e05dac15b333ddbaab03ba56f2dfa4bf0"
SPDX_VERSION = "2.5.1"
# The libraries of the project's environment on 2026-12-04 whose sources hold docstrings.
DOCSTRING_SOURCES = {
    "transformers": "5.24.0", "torch": "2.13.0", "numpy": "2.4.6", "alembic": "1.20.1", "amqp": "5.4.2",
    "anyio": "4.16.0", "attrs": "26.1.0", "billiard": "4.3.2", "boto3": "1.44.8", "botocore": "1.44.8",
    "celery": "5.6.3", "cfn-lint": "1.58.0", "click": "8.5.1", "contourpy": "1.3.3", "cryptography": "50.0.2",
    "docker": "7.2.0", "fastapi": "0.165.0", "filelock": "4.3.2", "flask": "3.1.3", "flower": "2.2.0",
    "fonttools": "4.68.0", "fsspec": "2026.9.0", "graphql-core": "3.3.2", "httpcore": "1.0.9", "httpx": "0.29.0",
    "huggingface-hub": "2.4.0", "hypothesis": "6.170.27", "jinja2": "3.1.6", "jsonschema": "4.26.0",
    "kombu": "5.7.0", "mako": "1.4.3", "markdown-it-py": "4.3.0", "matplotlib": "3.11.2", "moto": "5.2.6",
    "mpmath": "1.3.0", "networkx": "3.6.1", "nltk": "3.10.4", "openai": "3.63.0", "pillow": "13.0.0",
    "prompt-toolkit": "3.0.53", "psycopg": "3.3.9", "pydantic": "2.14.4", "pygments": "2.21.0",
    "pyparsing": "3.3.3", "pytest": "9.2.0", "python-dateutil": "2.9.0.post0", "redis": "8.2.0",
    "requests": "2.34.2", "rich": "15.0.0", "s3transfer": "0.19.3", "sqlalchemy": "2.1.9", "starlette": "1.10.0",
    "sympy": "1.14.0", "tornado": "6.6.1", "tqdm": "4.70.1", "urllib3": "2.8.0", "uvicorn": "0.55.0",
    "watchdog": "7.1.1", "werkzeug": "3.1.9",
}
SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|Example usage|Note|Notes|"
    r"Attributes|Inputs|Outputs|Shape|See Also|Warning|Warnings|Keyword Args|Kwargs|Usage)\s*:?\s*$"
    r"|^\s*(>>>|\.\. |```|-{3,}|={3,}|\* |:param|:type|:return|:rtype|:raises|@param|@return)",
)
Row = dict[str, str]


def squash(text: str) -> str:
    return " ".join(text.split())


# ---- Debian ---------------------------------------------------------------------------------

def fetch_debian(cache: Path) -> Path:
    """The pinned Translation-en.xz, downloaded once into `cache` and checked."""
    path = cache / "debian-bookworm-main-Translation-en.xz"
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part")
        try:
            with urllib.request.urlopen(DEBIAN_URL, timeout=120) as resp:
                tmp.write_bytes(resp.read())
        except OSError as exc:
            raise DataError(f"could not fetch {DEBIAN_URL}: {exc}; pass --debian-file with a copy") from exc
        tmp.replace(path)
    check_debian(path)
    return path


def check_debian(path: Path) -> None:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != DEBIAN_SHA256:
        raise DataError(
            f"{path} has sha256 {digest}, not the pinned {DEBIAN_SHA256} (bookworm 12.15, 2026-07-11): Debian "
            "published a newer point release; take the pinned file from snapshot.debian.org "
            "(archive/debian/20260711T000000Z) and pass it with --debian-file")


def parse_translation(text: str) -> Iterator[tuple[str, str, str]]:
    """(package, synopsis, long description paragraphs joined by newlines) of each record."""
    for record in text.split("\n\n"):
        fields: dict[str, list[str]] = {}
        current = ""
        for line in record.splitlines():
            if line.startswith(" ") and current:
                fields[current].append(line[1:])
            elif ":" in line:
                current, _, value = line.partition(":")
                fields[current] = [value.strip()]
        desc = fields.get("Description-en")
        if not desc or "Package" not in fields:
            continue
        paragraphs: list[str] = []
        para: list[str] = []
        for line in [*desc[1:], "."]:
            if line.strip() == ".":
                if para:
                    paragraphs.append(squash(" ".join(para)))
                para = []
            else:
                para.append(line)
        yield fields["Package"][0], squash(desc[0]), "\n".join(paragraphs)


def iter_debian(path: Path) -> Iterator[Row]:
    check_debian(path)
    for package, synopsis, long in parse_translation(lzma.decompress(path.read_bytes()).decode("utf-8")):
        text = squash(long)
        n_syn, n_text = len(synopsis.split()), len(text.split())
        if not (2 <= n_syn <= 20 and 8 <= n_text <= 200) or "http" in synopsis:
            continue
        # Sibling packages (foo, foo-data, foo-doc) share the opening paragraph: one split for all.
        first = long.split("\n", 1)[0].lower()
        yield {"source": f"debian/{package}", "text": text, "summary": synopsis, "group": first,
               "dedupe": text.lower()}


# ---- Python docstrings ----------------------------------------------------------------------

def split_docstring(doc: str) -> tuple[str, str] | None:
    """(summary line, descriptive body) of a docstring, or None when it has no usable pair."""
    paragraphs = re.split(r"\n\s*\n", doc.strip())
    if len(paragraphs) < 2:
        return None
    summary = squash(paragraphs[0])
    body_lines: list[str] = []
    for line in "\n\n".join(paragraphs[1:]).splitlines():
        if SECTION.match(line):
            break
        body_lines.append(line)
    body = squash("\n".join(body_lines))
    n_summary, n_body = len(summary.split()), len(body.split())
    if not (3 <= n_summary <= 24 and 8 <= n_body <= 160):
        return None
    if summary.endswith((":", ",")) or "http" in summary or re.search(r"[<>{}\[\]|`]{2,}|Copyright", summary):
        return None
    return summary, body


def _distribution(name: str, version: str, cache: Path) -> importlib.metadata.Distribution:
    """The pinned release of `name`: the installed one when it matches, else a cached copy."""
    try:
        dist = importlib.metadata.distribution(name)
        if dist.version.split("+")[0] == version:
            return dist
    except importlib.metadata.PackageNotFoundError:
        pass
    target = cache / "site" / f"{name}-{version}"
    if not (target / ".complete").is_file():
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(target),
               f"{name}=={version}"]
        if subprocess.run(cmd, check=False).returncode:
            raise DataError(f"{name}=={version} is needed to build the data and pip could not fetch it")
        (target / ".complete").touch()
    for dist in importlib.metadata.distributions(path=[str(target)]):
        if dist.version.split("+")[0] == version:
            return dist
    raise DataError(f"{target} does not hold {name}=={version}")


def _python_files(dist: importlib.metadata.Distribution) -> Iterator[tuple[str, Path]]:
    for file in sorted(dist.files or [], key=str):
        rel = str(file)
        if not rel.endswith(".py") or "/test" in rel or rel.startswith("test") or "/_vendor" in rel:
            continue
        yield rel, Path(str(dist.locate_file(file)))


def iter_docstrings(cache: Path) -> Iterator[Row]:
    for name, version in DOCSTRING_SOURCES.items():
        for rel, path in _python_files(_distribution(name, version, cache)):
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for node in ast.walk(tree):
                if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                doc = ast.get_docstring(node)
                pair = doc and split_docstring(doc)
                if pair:
                    where = f"{rel}:{getattr(node, 'name', '<module>')}"
                    yield {"source": where, "text": pair[1], "summary": pair[0], "group": pair[0].lower(),
                           "dedupe": pair[0].lower()}


# ---- SPDX licences --------------------------------------------------------------------------

def iter_legal(cache: Path) -> Iterator[Row]:
    root = Path(str(_distribution("spdx", SPDX_VERSION, cache).locate_file("spdx"))) / "data"
    records = json.loads((root / "db.json").read_text(encoding="utf-8"))["licenses"]
    for rec in sorted(records, key=lambda r: r["id"]):
        raw = (root / rec["template"]).read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
        summary = f"{rec['name']} ({rec['id']})" + (", OSI approved" if rec.get("osi_approved") else "")
        chunk: list[str] = []
        for para in [squash(p) for p in re.split(r"\n\s*\n", text)] + [""]:
            if para:
                chunk.append(para)
            words = sum(len(c.split()) for c in chunk)
            if (not para and chunk) or words >= 60:
                passage = " ".join(chunk)
                chunk = []
                if len(passage.split()) >= 12:
                    kept = " ".join(passage.split()[:160])
                    yield {"source": f"spdx/{rec['id']}", "text": kept, "summary": summary, "group": kept.lower(),
                           "dedupe": kept.lower() + "\0" + summary}
