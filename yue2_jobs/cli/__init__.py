"""`yue2` command line: the pipeline's servers (api, watchdog, flower, ...), jobs and batches over
the API (submit, wait, ...), checkpoint versions, A/B experiments and the model tools (train,
eval, convert, summarize). The workers are their own program: `yue2-worker`."""

from __future__ import annotations

import argparse
import os
import sys

from yue2_jobs.cli import ab, apikeys, checkpoints, jobs, model, server
from yue2_jobs.errors import Yue2Error


def build_parser(*, train_arguments: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="yue2", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    checkpoints.add_commands(sub)
    ab.add_commands(sub)
    server.add_commands(sub)
    apikeys.add_commands(sub)
    jobs.add_commands(sub)
    model.add_commands(sub, train_arguments=train_arguments)
    return parser


def main(argv: list[str] | None = None) -> int:
    # transformers reads this when (and only if) a command imports it; importing it here would cost
    # every command seconds of torch import.
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
