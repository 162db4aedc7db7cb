"""What the `yue2` command groups share: settings, the API client, common options."""

from __future__ import annotations

import argparse
import os
from functools import lru_cache
from typing import TYPE_CHECKING

from yue2_jobs.cli.failures import one_line
from yue2_jobs.core.config import Settings, normalize_api_url, settings_or_exit
from yue2_jobs.decode.params import DEFAULT_MAX_NEW_TOKENS, DEFAULT_MODE, MODES, DecodingParams

if TYPE_CHECKING:
    from yue2_jobs.client import Client


def settings() -> Settings:
    return settings_or_exit("yue2")


def add_api_url(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-url", default=None,
                   help="the API's URL, with or without /v1 (default: YUE2_API_URL, else where `yue2 api` binds: "
                        f"YUE2_API_HOST and YUE2_API_PORT, 0.0.0.0 as 127.0.0.1; now {_api_url_now()})")


def _api_url_now() -> str:
    """What --api-url defaults to in this environment, for --help (a bad setting is named when a command runs)."""
    return _api_url_in(tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("YUE2_"))))


@lru_cache(maxsize=4)
def _api_url_in(environment: tuple[tuple[str, str], ...]) -> str:
    """Once per environment: a dozen subcommands show it, and reading the settings takes milliseconds."""
    try:
        return Settings().client_api_url
    except ValueError as exc:  # pydantic's ValidationError too
        return f"none: {one_line(exc)[:200]}"


def api_url(args: argparse.Namespace) -> str:
    """The API's base URL (no /v1) for a command: --api-url, else the settings' `client_api_url`."""
    try:
        return normalize_api_url(args.api_url) if args.api_url else settings().client_api_url
    except ValueError as exc:
        raise SystemExit(f"yue2: {exc}") from None


def add_client_args(p: argparse.ArgumentParser) -> None:
    add_api_url(p)
    p.add_argument("--api-key", default=None, help="a key of `yue2 apikey create` (default: YUE2_API_KEY; with "
                   "neither, the command stops and says how to create one)")


def client(args: argparse.Namespace) -> Client:
    from yue2_jobs.client import Client

    key = args.api_key or os.environ.get("YUE2_API_KEY")
    if not key:
        raise SystemExit("yue2: no API key: pass --api-key or set YUE2_API_KEY (create one with "
                         "`yue2 apikey create --tenant NAME`)")
    return Client(api_url(args), key)


def add_controls(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repetition-penalty", type=float, default=None,
                   help="HF generate's repetition penalty (default: the checkpoint's generation config)")
    p.add_argument("--no-repeat-ngram-size", type=int, default=None,
                   help="ban repeating any n-gram of this size (default: the checkpoint's generation config)")


def add_decoding(p: argparse.ArgumentParser) -> None:
    """`--mode`, `--max-new-tokens` and the repetition controls, defaulting as a job does (the
    server's defaults: `YUE2_DEFAULT_MODE`, `YUE2_DEFAULT_MAX_NEW_TOKENS`, else `DecodingParams`')."""
    p.add_argument("--mode", default=None, choices=MODES,
                   help=f"decoding mode (default: YUE2_DEFAULT_MODE, else {DEFAULT_MODE})")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"length cap in tokens (default: YUE2_DEFAULT_MAX_NEW_TOKENS, else {DEFAULT_MAX_NEW_TOKENS})")
    add_controls(p)


def decoding(args: argparse.Namespace) -> DecodingParams:
    """The `DecodingParams` of `add_decoding`'s options; a bad value exits with its message."""
    s = settings()
    mode = s.default_mode if args.mode is None else args.mode
    max_new = s.default_max_new_tokens if args.max_new_tokens is None else args.max_new_tokens
    try:
        return DecodingParams(mode=mode, max_new_tokens=max_new, repetition_penalty=args.repetition_penalty,
                              no_repeat_ngram_size=args.no_repeat_ngram_size)
    except ValueError as exc:
        raise SystemExit(f"yue2: {exc}") from None
