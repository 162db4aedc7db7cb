"""`yue2 submit | status | cancel | wait | results`: jobs and batches over the HTTP API."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from yue2_jobs.cli.common import add_client_args, client

if TYPE_CHECKING:
    from tqdm import tqdm

    from yue2_jobs.client import Client


def _metadata(args: argparse.Namespace) -> dict[str, str] | None:
    """The batch's metadata from --metadata KEY=VALUE and --name (`metadata.name`, which the console
    shows); the API checks the limits (16 pairs, keys 64 and values 512 characters)."""
    metadata: dict[str, str] = {}
    for pair in args.metadata or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"yue2 submit: --metadata wants KEY=VALUE, got {pair!r}")
        if key in metadata:
            raise SystemExit(f"yue2 submit: --metadata {key} is given twice")
        metadata[key] = value
    if args.name is not None:
        if "name" in metadata:
            raise SystemExit("yue2 submit: --name and --metadata name=... both name the batch; give one")
        metadata["name"] = args.name
    return metadata or None


def _submit(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    path = Path(args.file)
    metadata = _metadata(args)  # before the upload: a typo costs no upload
    c = client(args)
    with tqdm(total=path.stat().st_size, unit="B", unit_scale=True, desc="upload", file=sys.stderr) as bar:
        f = c.upload(path, progress=bar.update)
    batch = c.create_batch(f["id"], endpoint=args.endpoint, metadata=metadata, experiment_id=args.experiment)
    print(batch["id"])
    print(f"{batch['request_counts']['total']} requests, status {batch['status']}", file=sys.stderr)


def _retry(args: argparse.Namespace) -> None:
    batch = client(args).retry_failed(args.id)
    print(batch["id"])
    print(f"{batch['request_counts']['total']} requests of {args.id} again, status {batch['status']}",
          file=sys.stderr)


def _status(args: argparse.Namespace) -> None:
    print(json.dumps(client(args).status(args.id), indent=2, ensure_ascii=False))


class _JobLine:
    """One job's wait on stderr: its status and the seconds since `yue2 wait` started, redrawn in
    place on a terminal, a line per change of status otherwise (a log keeps every step once)."""

    def __init__(self, job_id: str) -> None:
        self.job_id, self.start, self.last, self.status = job_id, time.monotonic(), "", ""
        self.tty = sys.stderr.isatty()

    def update(self, state: dict[str, Any]) -> None:
        line = f"{self.job_id}: {state['status']}, {time.monotonic() - self.start:.0f}s"
        if self.tty:  # padded over a longer previous line
            print(f"\r{line:<{len(self.last)}}", end="", file=sys.stderr, flush=True)
        elif state["status"] != self.status:
            print(line, file=sys.stderr, flush=True)
        self.last, self.status = line, state["status"]

    def close(self) -> None:
        if self.tty and self.last:
            print(file=sys.stderr, flush=True)


class _BatchBar:
    """A batch's wait: a progress bar over its requests, drawn once the first answer gives the total
    (so never `0req [?req/s]` before it)."""

    def __init__(self, batch_id: str) -> None:
        self.batch_id = batch_id
        self.bar: tqdm | None = None

    def update(self, state: dict[str, Any]) -> None:
        from tqdm import tqdm

        from yue2_jobs.client import TERMINAL_BATCH

        counts = state["request_counts"]
        if self.bar is None:
            self.bar = tqdm(total=counts["total"], unit="req", desc=self.batch_id, file=sys.stderr)
        self.bar.n = counts["completed"] + counts["failed"]
        # The final state is drawn once, by the bar's close: refreshing it here too printed the last line twice.
        self.bar.set_postfix_str(state["status"], refresh=state["status"] not in TERMINAL_BATCH)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _wait(args: argparse.Namespace) -> None:
    c = client(args)
    shown = _BatchBar(args.id) if args.id.startswith("batch_") else _JobLine(args.id)
    try:
        state = c.wait(args.id, poll_s=args.poll, timeout_s=args.timeout, on_update=shown.update)
    finally:
        shown.close()
    print(json.dumps({k: state.get(k) for k in ("id", "status", "request_counts", "output_file_id",
                                                 "error_file_id", "output", "error") if k in state},
                     ensure_ascii=False))
    if state["status"] not in ("completed", "succeeded"):
        raise SystemExit(1)


def _results(args: argparse.Namespace) -> None:
    c = client(args)
    state = c.status(args.id)
    out = sys.stdout.buffer if args.output == "-" else open(args.output, "wb")
    try:
        if args.id.startswith("batch_"):
            _batch_results(c, state, out, args)
        elif not args.errors_only or state.get("error"):
            out.write((json.dumps(state, ensure_ascii=False) + "\n").encode())
            if args.files and state.get("files"):
                _save_render_files(c, json.dumps({"custom_id": state["id"], "response": {"body": {
                    "id": state["id"], "files": state["files"]}}}).encode(), Path(args.files))
    finally:
        if out is not sys.stdout.buffer:
            out.close()


def _batch_results(c: Client, state: dict[str, Any], out: BinaryIO, args: argparse.Namespace) -> None:
    """The output file, the error file after it (--errors), or the error file alone (--errors-only)."""
    if not state.get("output_file_id") and not state.get("error_file_id"):
        raise SystemExit(f"yue2: batch is {state['status']}; results exist once it is completed or cancelled")
    keys = (("error_file_id",) if args.errors_only else ("output_file_id", "error_file_id") if args.errors
            else ("output_file_id",))
    for key in keys:
        if state.get(key):
            data = c.file_content(state[key])
            out.write(data)
            if args.files and key == "output_file_id":
                _save_render_files(c, data, Path(args.files))
    if args.errors_only and not state.get("error_file_id"):
        print(f"{state['id']}: no error file: no line failed", file=sys.stderr)


def _save_render_files(c: Client, output_jsonl: bytes, directory: Path) -> None:
    """Each render job's images as DIR/<custom_id>.<svg|png> (the name made safe for a file system)."""
    directory.mkdir(parents=True, exist_ok=True)
    saved = 0
    for line in output_jsonl.decode().splitlines():
        body = json.loads(line)["response"]["body"]
        name = re.sub(r"[^\w.-]+", "_", json.loads(line)["custom_id"]).strip("._") or body["id"]
        for suffix in body.get("files") or {}:
            (directory / f"{name}.{suffix}").write_bytes(c.job_file(body["id"], suffix))
            saved += 1
    print(f"saved {saved} image(s) to {directory}", file=sys.stderr)


def _cancel(args: argparse.Namespace) -> None:
    state = client(args).cancel(args.id)
    print(f"{state['id']}: {state['status']}")


def _add_id(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", help="a job id (job_...) or batch id (batch_...)")


def add_commands(sub: Any) -> None:
    p = sub.add_parser("submit", help="upload a JSONL file and start a batch on it; prints the batch id")
    p.add_argument("file", help="a JSON Lines file: one request object per line")
    p.add_argument("--endpoint", default="/v1/summarize", choices=["/v1/summarize", "/v1/generate", "/v1/render_font"],
                   help="what every line of the file asks for")
    p.add_argument("--experiment", default=None, help="an experiment id (`yue2 ab create`): it assigns the variants "
                   "(default: none, each line's own variant)")
    p.add_argument("--name", default=None, help="the batch's name, shown in the console (`metadata.name`; default: "
                   "none)")
    p.add_argument("--metadata", action="append", default=None, metavar="KEY=VALUE", help="a metadata pair on the "
                   "batch, repeatable: up to 16 pairs, keys 64 and values 512 characters (default: none)")
    add_client_args(p)
    p.set_defaults(func=_submit)
    for name, func, text in (("status", _status, "show a job or batch"), ("cancel", _cancel, "cancel a job or batch")):
        p = sub.add_parser(name, help=text)
        _add_id(p)
        add_client_args(p)
        p.set_defaults(func=func)
    p = sub.add_parser("retry", help="run an ended batch's failed, expired and cancelled lines again as a new "
                       "batch (POST /v1/batches/ID/retry_failed); prints the new batch id")
    p.add_argument("id", help="the ended batch's id (batch_...)")
    add_client_args(p)
    p.set_defaults(func=_retry)
    p = sub.add_parser("wait", help="wait for a job (its status and elapsed time) or a batch (a progress bar)")
    _add_id(p)
    p.add_argument("--poll", type=float, default=1.0, help="seconds between status requests")
    p.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (default: wait "
                   "as long as it takes)")
    add_client_args(p)
    p.set_defaults(func=_wait)
    p = sub.add_parser("results", help="write a batch's output file (or a job's record) as JSONL")
    _add_id(p)
    p.add_argument("-o", "--output", default="-", help="file to write; - is standard output")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--errors", action="store_true", help="append the error file's lines to the output's "
                       "(default: the output file alone)")
    which.add_argument("--errors-only", action="store_true", help="only the error file's lines (a job: its "
                       "record only if it has an error)")
    p.add_argument("--files", default=None, metavar="DIR", help="render jobs: also save each image as "
                   "DIR/<custom_id>.svg|png (default: none saved)")
    add_client_args(p)
    p.set_defaults(func=_results)
