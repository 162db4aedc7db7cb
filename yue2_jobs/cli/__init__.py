"""`yue2` command line: the pipeline's servers (api, watchdog, flower, ...), jobs and batches over
the API (submit, wait, ...), checkpoint versions, A/B experiments and the model tools (train,
eval, convert, summarize). The workers are their own program: `yue2-worker`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from yue2_jobs.cli import ab, apikeys, checkpoints, jobs, model, server, stack
from yue2_jobs.cli.failures import one_line


class HelpWithDefaults(argparse.HelpFormatter):
    """Each option's help ends with its default, unless the help already names it or there is none."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        shown = action.option_strings or action.nargs in ("?", "*")
        default = action.default
        absent = default is None or default is False or default == "" or default is argparse.SUPPRESS  # 0 is a default
        if shown and "default" not in text and not absent:
            text += " (default: %(default)s)"
        return text


class Yue2Parser(argparse.ArgumentParser):
    """The `yue2` parser and every subcommand's (argparse makes subparsers of the parser's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpWithDefaults)
        super().__init__(*args, **kwargs)


def build_parser(*, train_arguments: bool = True) -> argparse.ArgumentParser:
    parser = Yue2Parser(prog="yue2", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    checkpoints.add_commands(sub)
    ab.add_commands(sub)
    server.add_commands(sub)
    stack.add_commands(sub)
    apikeys.add_commands(sub)
    jobs.add_commands(sub)
    model.add_commands(sub, train_arguments=train_arguments)
    return parser


def main(argv: list[str] | None = None) -> int:
    # transformers reads this when (and only if) a command imports it; importing it here would cost
    # every command seconds of torch import.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(train_arguments=argv[:1] in (["train"], ["train-drafter"])).parse_args(argv)
    try:
        args.func(args)
    except KeyboardInterrupt:
        print("yue2: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # every failure is one line; YUE2_DEBUG=1 shows the traceback
        if os.environ.get("YUE2_DEBUG"):
            raise
        print(f"yue2: error: {one_line(exc)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
