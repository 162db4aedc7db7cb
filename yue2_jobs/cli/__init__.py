"""`yue2` command line: the pipeline's servers (api, watchdog, flower, ...), jobs and batches over
the API (submit, wait, ...), checkpoint versions, A/B experiments and the model tools (train,
eval, convert, summarize). The workers are their own program: `yue2-worker`."""

from __future__ import annotations

import argparse
import os
import select
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
    try:
        try:
            return _run(sys.argv[1:] if argv is None else argv)
        finally:
            sys.stdout.flush()  # here, not at exit, so that a reader gone before the last write is met below
    except BrokenPipeError:  # from any command's output, --help's included
        if stdout_gone():
            return _output_closed()
        raise  # a pipe of our own (to a child, a socket) broke: a failure, not a reader that left


def _run(argv: list[str]) -> int:
    args = build_parser(train_arguments=argv[:1] in (["train"], ["train-drafter"])).parse_args(argv)
    try:
        args.func(args)
    except KeyboardInterrupt:
        print("yue2: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # every failure is one line; YUE2_DEBUG=1 shows the traceback
        if isinstance(exc, BrokenPipeError) and stdout_gone():
            raise  # the reader of our output left: main() ends quietly
        if os.environ.get("YUE2_DEBUG"):
            raise
        print(f"yue2: error: {one_line(exc)}", file=sys.stderr)
        return 2
    return 0


SIGPIPE_EXIT = 128 + 13  # what a shell reports for a writer its reader left (`yes | head -1`), as for `cat`


def stdout_gone() -> bool:
    """Whether standard output is a pipe (or socket) whose reader has gone: only then is a
    BrokenPipeError the reader leaving (`| head`) rather than some other pipe of ours breaking.
    The kernel reports a write end without readers as POLLERR."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture): it has no reader to lose
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _output_closed() -> int:
    """The reader of our output went away (`yue2 results ID | head`): stop quietly, as `cat` does.
    Standard output is pointed at /dev/null first, so the interpreter's flush at exit does not
    print a second BrokenPipeError."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # not a file (a test's capture): nothing of ours is flushed to it at exit
        pass
    return SIGPIPE_EXIT


if __name__ == "__main__":
    sys.exit(main())
