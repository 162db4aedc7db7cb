"""`yue2` command line: the job pipeline (api, worker, submit, wait, ...) and the model tools
(train, eval, convert, summarize)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from yue2_jobs.core.config import MODES
from yue2_jobs.errors import Yue2Error


def _cmd_convert_bart(args: argparse.Namespace) -> None:
    from yue2_jobs.model.convert import convert_bart_checkpoint

    print(f"wrote {convert_bart_checkpoint(args.src, args.dst)}")


def _cmd_train(args: argparse.Namespace) -> None:
    from yue2_jobs.model.train import TrainArgs, train

    train(TrainArgs(**{k: v for k, v in vars(args).items() if k in TrainArgs.__dataclass_fields__}))


def _cmd_eval(args: argparse.Namespace) -> None:
    from yue2_jobs.model.evaluate import evaluate_checkpoint, lead_baseline

    rows = []
    for corpus in args.set:
        results = [("lead-1", lead_baseline(data_dir=args.data, corpus=corpus, split=args.split, limit=args.limit))]
        results += [(str(ckpt), evaluate_checkpoint(ckpt, data_dir=args.data, corpus=corpus, split=args.split,
                                                    limit=args.limit, batch_size=args.batch_size,
                                                    max_new_tokens=args.max_new_tokens, mode=args.mode,
                                                    **_controls(args)))
                    for ckpt in args.checkpoint]
        rows += [{"checkpoint": name, "set": corpus, "split": args.split, "n": r.count, "rouge1": r.rouge1,
                  "rouge2": r.rouge2, "rougeL": r.rougeL, "distinct": r.distinct, "degenerate": r.degenerate}
                 for name, r in results]
    print(f"{'checkpoint':<24} {'set':<8} {'n':>5} {'ROUGE-1':>8} {'ROUGE-2':>8} {'ROUGE-L':>8} {'distinct':>9} "
          f"{'degenerate':>11}")
    for row in rows:
        print(f"{Path(row['checkpoint']).name:<24} {row['set']:<8} {row['n']:>5} "
              f"{100 * row['rouge1']:>8.2f} {100 * row['rouge2']:>8.2f} {100 * row['rougeL']:>8.2f} "
              f"{100 * row['distinct']:>8.1f}% {100 * row['degenerate']:>10.1f}%")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


def _controls(args: argparse.Namespace) -> dict[str, float | int | None]:
    return {"repetition_penalty": args.repetition_penalty, "no_repeat_ngram_size": args.no_repeat_ngram_size}


def _add_controls(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repetition-penalty", type=float, default=None,
                   help="HF generate's repetition penalty (default: the checkpoint's generation config)")
    p.add_argument("--no-repeat-ngram-size", type=int, default=None,
                   help="ban repeating any n-gram of this size (default: the checkpoint's generation config)")


def _cmd_summarize(args: argparse.Namespace) -> None:
    from yue2_jobs.model.checkpoint import load_checkpoint
    from yue2_jobs.model.evaluate import summarize

    model, tokenizer = load_checkpoint(args.checkpoint)
    texts = args.text or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    for text, summary in zip(texts, summarize(model, tokenizer, texts, max_new_tokens=args.max_new_tokens,
                                              mode=args.mode, **_controls(args)), strict=True):
        print(json.dumps({"input": text[:80] + ("…" if len(text) > 80 else ""), "summary": summary},
                         ensure_ascii=False))


def _settings() -> Any:
    from pydantic import ValidationError

    from yue2_jobs.core.config import Settings

    try:
        return Settings()
    except ValidationError as exc:
        raise SystemExit(f"yue2: invalid configuration: {exc}") from None


def _cmd_migrate(args: argparse.Namespace) -> None:
    from yue2_jobs.db.migrate import upgrade_head

    url = upgrade_head(args.database_url or _settings().resolved_database_url)
    print(f"database at head: {url.split('@')[-1]}")


def _cmd_apikey(args: argparse.Namespace) -> None:
    from yue2_jobs.auth import create_api_key
    from yue2_jobs.db.session import session_factory

    with session_factory(_settings().resolved_database_url)() as session:
        print(create_api_key(session, tenant=args.tenant, name=args.name))


def _cmd_api(args: argparse.Namespace) -> None:
    import uvicorn

    from yue2_jobs.api.app import create_app

    settings = _settings()
    uvicorn.run(create_app(settings), host=args.host or settings.api_host, port=args.port or settings.api_port,
                log_level="warning")


def _cmd_worker(args: argparse.Namespace) -> None:
    settings = _settings()
    variant = args.variant or settings.default_variant
    if args.child:
        from workers.main import run_worker

        run_worker(settings, variant=variant, name=args.name, reconcile=not args.no_reconcile)
        return
    from workers.launcher import launch
    from yue2_jobs.fonts.params import FONTS_VARIANT

    if variant not in settings.checkpoints and variant != FONTS_VARIANT:
        raise SystemExit(f"yue2 worker: variant {variant!r} is not in YUE2_CHECKPOINTS "
                         f"({sorted(settings.checkpoints)}) nor {FONTS_VARIANT!r} (render jobs)")
    raise SystemExit(launch(variant=variant, procs=args.procs or settings.worker_procs,
                            metrics_port=settings.metrics_port, max_backoff_s=settings.worker_restart_max_s,
                            ready_file=settings.worker_ready_file, torch_threads=settings.torch_threads,
                            host=args.host, dry_run=args.dry_run,
                            gpus=[] if variant == FONTS_VARIANT else None))  # render workers: CPU processes


def _cmd_watchdog(args: argparse.Namespace) -> None:
    from yue2_jobs.checkpoints.watchdog import run

    run(_settings(), once=args.once)


def _cmd_flower(args: argparse.Namespace) -> None:
    settings = _settings()
    auth = args.basic_auth or settings.flower_basic_auth
    if not auth or ":" not in auth:
        raise SystemExit("yue2 flower: basic auth is required: set YUE2_FLOWER_BASIC_AUTH=user:password "
                         "(or --basic-auth user:password)")
    from yue2_jobs.queue import make_celery

    app = make_celery(settings)
    # Flower inspects workers with several commands at once, each holding a pooled connection
    # beside its event receiver: the workers' small pool would leave it waiting forever.
    app.conf.broker_pool_limit = 32
    argv = ["flower", f"--port={args.port or settings.flower_port}", f"--address={args.address}",
            f"--basic-auth={auth}", "--persistent=False"]
    app.start(argv)


def _cmd_reconcile(args: argparse.Namespace) -> None:
    from yue2_jobs.db.session import session_factory
    from yue2_jobs.jobs.reconciler import reconcile_once
    from yue2_jobs.queue import make_celery
    from yue2_jobs.storage import storage_from_url

    s = _settings()
    with session_factory(s.resolved_database_url)() as session:
        report = reconcile_once(session, settings=s, celery_app=make_celery(s),
                                storage=storage_from_url(s.resolved_storage_url, endpoint_url=s.s3_endpoint_url))
    print(json.dumps(report.__dict__))


def _client(args: argparse.Namespace) -> Any:
    from yue2_jobs.client import Client

    key = args.api_key or os.environ.get("YUE2_API_KEY")
    if not key:
        raise SystemExit("yue2: no API key: pass --api-key or set YUE2_API_KEY (create one with `yue2 apikey`)")
    return Client(args.api_url, key)


def _cmd_submit(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    path = Path(args.file)
    client = _client(args)
    with tqdm(total=path.stat().st_size, unit="B", unit_scale=True, desc="upload", file=sys.stderr) as bar:
        f = client.upload(path, progress=bar.update)
    batch = client.create_batch(f["id"], endpoint=args.endpoint, experiment_id=args.experiment)
    print(batch["id"])
    print(f"{batch['request_counts']['total']} requests, status {batch['status']}", file=sys.stderr)


def _cmd_status(args: argparse.Namespace) -> None:
    print(json.dumps(_client(args).status(args.id), indent=2, ensure_ascii=False))


def _cmd_wait(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    client = _client(args)
    is_batch = args.id.startswith("batch_")
    with tqdm(total=None, unit="req" if is_batch else "job", desc=args.id[:18], file=sys.stderr) as bar:
        def update(state: dict[str, Any]) -> None:
            if is_batch:
                counts = state["request_counts"]
                bar.total = counts["total"]
                bar.n = counts["completed"] + counts["failed"]
            bar.set_postfix_str(state["status"])
            bar.refresh()

        state = client.wait(args.id, poll_s=args.poll, timeout_s=args.timeout, on_update=update)
    print(json.dumps({k: state.get(k) for k in ("id", "status", "request_counts", "output_file_id",
                                                 "error_file_id", "output", "error") if k in state},
                     ensure_ascii=False))
    if state["status"] not in ("completed", "succeeded"):
        raise SystemExit(1)


def _cmd_results(args: argparse.Namespace) -> None:
    client = _client(args)
    state = client.status(args.id)
    out = sys.stdout.buffer if args.output == "-" else open(args.output, "wb")
    try:
        if args.id.startswith("batch_"):
            if not state.get("output_file_id") and not state.get("error_file_id"):
                raise SystemExit(f"yue2: batch is {state['status']}; results exist once it is completed or "
                                 f"cancelled")
            for key in ("output_file_id", "error_file_id") if args.errors else ("output_file_id",):
                if state.get(key):
                    data = client.file_content(state[key])
                    out.write(data)
                    if args.files and key == "output_file_id":
                        _save_render_files(client, data, Path(args.files))
        else:
            out.write((json.dumps(state, ensure_ascii=False) + "\n").encode())
            if args.files and state.get("files"):
                _save_render_files(client, json.dumps({"custom_id": state["id"], "response": {"body": {
                    "id": state["id"], "files": state["files"]}}}).encode(), Path(args.files))
    finally:
        if out is not sys.stdout.buffer:
            out.close()


def _save_render_files(client: Any, output_jsonl: bytes, directory: Path) -> None:
    """Each render job's images as DIR/<custom_id>.<svg|png> (the name made safe for a file system)."""
    directory.mkdir(parents=True, exist_ok=True)
    saved = 0
    for line in output_jsonl.decode().splitlines():
        body = json.loads(line)["response"]["body"]
        name = re.sub(r"[^\w.-]+", "_", json.loads(line)["custom_id"]).strip("._") or body["id"]
        for suffix in body.get("files") or {}:
            (directory / f"{name}.{suffix}").write_bytes(client.job_file(body["id"], suffix))
            saved += 1
    print(f"saved {saved} image(s) to {directory}", file=sys.stderr)


def _cmd_cancel(args: argparse.Namespace) -> None:
    state = _client(args).cancel(args.id)
    print(f"{state['id']}: {state['status']}")


def _cmd_demo(args: argparse.Namespace) -> None:
    from yue2_jobs.demo import main as demo_main

    demo_main(items=args.items)


def _add_pipeline_commands(sub: Any) -> None:
    def client_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--api-url", default=os.environ.get("YUE2_API_URL", "http://127.0.0.1:8000"))
        p.add_argument("--api-key", default=None, help="default: $YUE2_API_KEY")

    from yue2_jobs.checkpoints.cli import add_parser as add_checkpoints_parser
    from yue2_jobs.experiments.cli import add_parser as add_ab_parser

    add_checkpoints_parser(sub)
    add_ab_parser(sub, client_args)
    p = sub.add_parser("migrate", help="bring the database to the newest schema (alembic upgrade head)")
    p.add_argument("--database-url", default=None, help="default: YUE2_DATABASE_URL")
    p.set_defaults(func=_cmd_migrate)
    p = sub.add_parser("apikey", help="create an API key for a tenant (printed once)")
    p.add_argument("--tenant", required=True)
    p.add_argument("--name", default="")
    p.set_defaults(func=_cmd_apikey)
    p = sub.add_parser("api", help="serve the HTTP API")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    p.set_defaults(func=_cmd_api)
    p = sub.add_parser("worker", help="run the workers of a host: one process per GPU (or --procs on a CPU host), "
                       "NUMA-bound and supervised")
    p.add_argument("--variant", default=None, help="default: YUE2_DEFAULT_VARIANT; `fonts` runs render jobs "
                   "(CPU processes on queue yue2.fonts)")
    p.add_argument("--procs", type=int, default=None, help="processes on a CPU-only host (YUE2_WORKER_PROCS)")
    p.add_argument("--dry-run", action="store_true", help="print each child's CPUs, NUMA node, environment and command")
    p.add_argument("--host", default=None, help="host part of the children's node names (default: this host's "
                   "name); give each launcher on one host its own, e.g. base.$(hostname)")
    p.add_argument("--child", action="store_true", help="be one worker process (what the launcher starts)")
    p.add_argument("--name", default=None, help="Celery node name of a --child (default variant-pid@host)")
    p.add_argument("--no-reconcile", action="store_true", help="do not run the reconciler in this worker")
    p.set_defaults(func=_cmd_worker)
    p = sub.add_parser("watchdog", help="validate new checkpoint versions, activate them, swap the workers")
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.set_defaults(func=_cmd_watchdog)
    p = sub.add_parser("flower", help="serve Flower (Celery monitoring) with basic auth")
    p.add_argument("--port", type=int, default=None, help="default: YUE2_FLOWER_PORT")
    p.add_argument("--address", default="127.0.0.1")
    p.add_argument("--basic-auth", default=None, help="user:password (default: YUE2_FLOWER_BASIC_AUTH)")
    p.set_defaults(func=_cmd_flower)
    p = sub.add_parser("reconcile", help="run the reconciler once")
    p.set_defaults(func=_cmd_reconcile)
    p = sub.add_parser("submit", help="upload a JSONL file and start a batch on it; prints the batch id")
    p.add_argument("file")
    p.add_argument("--endpoint", default="/v1/summarize", choices=["/v1/summarize", "/v1/generate", "/v1/render_font"])
    p.add_argument("--experiment", default=None, help="an experiment id (`yue2 ab create`): it assigns the variants")
    client_args(p)
    p.set_defaults(func=_cmd_submit)
    for name, func, text in (("status", _cmd_status, "show a job or batch"),
                             ("cancel", _cmd_cancel, "cancel a job or batch")):
        p = sub.add_parser(name, help=text)
        p.add_argument("id")
        client_args(p)
        p.set_defaults(func=func)
    p = sub.add_parser("wait", help="wait for a job or batch to finish, with a progress bar")
    p.add_argument("id")
    p.add_argument("--poll", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=None)
    client_args(p)
    p.set_defaults(func=_cmd_wait)
    p = sub.add_parser("results", help="write a batch's output file (or a job's record) as JSONL")
    p.add_argument("id")
    p.add_argument("-o", "--output", default="-")
    p.add_argument("--errors", action="store_true", help="append the error file's lines too")
    p.add_argument("--files", default=None, metavar="DIR", help="render jobs: also save each image as "
                   "DIR/<custom_id>.svg|png")
    client_args(p)
    p.set_defaults(func=_cmd_results)
    p = sub.add_parser("demo", help="the embedded pipeline demo (`make demo`)")
    p.add_argument("--items", type=int, default=200)
    p.set_defaults(func=_cmd_demo)


def build_parser(*, train_arguments: bool = True) -> argparse.ArgumentParser:
    """`train_arguments=False` leaves the train command's options out: they come from the training
    module, which imports torch, and every other command (a worker's start) need not pay for it."""
    parser = argparse.ArgumentParser(prog="yue2", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_pipeline_commands(sub)

    p = sub.add_parser("convert-bart", help="import a local BartForConditionalGeneration directory")
    p.add_argument("src")
    p.add_argument("dst")
    p.set_defaults(func=_cmd_convert_bart)

    p = sub.add_parser("train", help="train (or fine-tune with --init) a checkpoint in three stages")
    if train_arguments:
        from yue2_jobs.model.train import add_arguments

        add_arguments(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("eval", help="ROUGE-1/2/L and degenerate share of checkpoints (and lead-1) on held-out sets")
    p.add_argument("checkpoint", nargs="+")
    p.add_argument("--set", action="append", choices=["general", "legal"], required=True,
                   help="eval set; repeat for several")
    p.add_argument("--data", default="data")
    p.add_argument("--split", default="eval", choices=["eval", "test"], help="held-out split (default eval)")
    p.add_argument("--limit", type=int, default=None, help="first N rows only")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--mode", default="ar", choices=MODES, help="decoding mode (default ar)")
    p.add_argument("--json", default=None, help="also write the rows here")
    _add_controls(p)
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("summarize", help="summarise texts given as arguments (or one per stdin line)")
    p.add_argument("checkpoint")
    p.add_argument("text", nargs="*")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--mode", default="hybrid", choices=MODES, help="decoding mode (default hybrid)")
    _add_controls(p)
    p.set_defaults(func=_cmd_summarize)
    return parser


def main(argv: list[str] | None = None) -> int:
    # transformers reads this when (and only if) a command imports it; importing it here would cost
    # every command, a worker's start included, seconds of torch import.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(train_arguments="train" in argv[:1]).parse_args(argv)
    try:
        args.func(args)
    except Yue2Error as exc:
        print(f"yue2: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
