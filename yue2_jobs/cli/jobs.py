"""`yue2 submit | status | cancel | wait | results`: jobs and batches over the HTTP API."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from yue2_jobs.cli.common import add_client_args, client

if TYPE_CHECKING:
    from yue2_jobs.client import Client


def _submit(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    path = Path(args.file)
    c = client(args)
    with tqdm(total=path.stat().st_size, unit="B", unit_scale=True, desc="upload", file=sys.stderr) as bar:
        f = c.upload(path, progress=bar.update)
    batch = c.create_batch(f["id"], endpoint=args.endpoint, experiment_id=args.experiment)
    print(batch["id"])
    print(f"{batch['request_counts']['total']} requests, status {batch['status']}", file=sys.stderr)


def _status(args: argparse.Namespace) -> None:
    print(json.dumps(client(args).status(args.id), indent=2, ensure_ascii=False))


def _wait(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    from yue2_jobs.client import TERMINAL_BATCH, TERMINAL_JOB

    c = client(args)
    is_batch = args.id.startswith("batch_")
    with tqdm(total=None, unit="req" if is_batch else "job", desc=args.id, file=sys.stderr) as bar:
        def update(state: dict[str, Any]) -> None:
            if is_batch:
                counts = state["request_counts"]
                bar.total = counts["total"]
                bar.n = counts["completed"] + counts["failed"]
            # The final state is drawn once, by the bar's close: refreshing it here too printed
            # the last line twice.
            bar.set_postfix_str(state["status"], refresh=state["status"] not in TERMINAL_BATCH | TERMINAL_JOB)

        state = c.wait(args.id, poll_s=args.poll, timeout_s=args.timeout, on_update=update)
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
            if not state.get("output_file_id") and not state.get("error_file_id"):
                raise SystemExit(f"yue2: batch is {state['status']}; results exist once it is completed or "
                                 f"cancelled")
            for key in ("output_file_id", "error_file_id") if args.errors else ("output_file_id",):
                if state.get(key):
                    data = c.file_content(state[key])
                    out.write(data)
                    if args.files and key == "output_file_id":
                        _save_render_files(c, data, Path(args.files))
        else:
            out.write((json.dumps(state, ensure_ascii=False) + "\n").encode())
            if args.files and state.get("files"):
                _save_render_files(c, json.dumps({"custom_id": state["id"], "response": {"body": {
                    "id": state["id"], "files": state["files"]}}}).encode(), Path(args.files))
    finally:
        if out is not sys.stdout.buffer:
            out.close()


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


def add_commands(sub: Any) -> None:
    p = sub.add_parser("submit", help="upload a JSONL file and start a batch on it; prints the batch id")
    p.add_argument("file", help="a JSON Lines file: one request object per line")
    p.add_argument("--endpoint", default="/v1/summarize", choices=["/v1/summarize", "/v1/generate", "/v1/render_font"],
                   help="what every line of the file asks for")
    p.add_argument("--experiment", default=None, help="an experiment id (`yue2 ab create`): it assigns the variants")
    add_client_args(p)
    p.set_defaults(func=_submit)
    for name, func, text in (("status", _status, "show a job or batch"), ("cancel", _cancel, "cancel a job or batch")):
        p = sub.add_parser(name, help=text)
        p.add_argument("id", help="a job id (job_...) or batch id (batch_...)")
        add_client_args(p)
        p.set_defaults(func=func)
    p = sub.add_parser("wait", help="wait for a job or batch to finish, with a progress bar")
    p.add_argument("id", help="a job id (job_...) or batch id (batch_...)")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between status requests")
    p.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (default: wait "
                   "as long as it takes)")
    add_client_args(p)
    p.set_defaults(func=_wait)
    p = sub.add_parser("results", help="write a batch's output file (or a job's record) as JSONL")
    p.add_argument("id", help="a job id (job_...) or batch id (batch_...)")
    p.add_argument("-o", "--output", default="-", help="file to write; - is standard output")
    p.add_argument("--errors", action="store_true", help="append the error file's lines too")
    p.add_argument("--files", default=None, metavar="DIR", help="render jobs: also save each image as "
                   "DIR/<custom_id>.svg|png")
    add_client_args(p)
    p.set_defaults(func=_results)
