"""Every setting of the pipeline, read from `YUE2_*` environment variables and validated at start.

The defaults are the embedded mode `make demo` runs on: SQLite, kombu's filesystem transport and
a local storage directory under `YUE2_HOME`. Production points the three URLs at Postgres, Redis
and S3 (or MinIO):

    YUE2_DATABASE_URL=postgresql+psycopg://user@db/yue2
    YUE2_BROKER_URL=redis://redis:6379/0
    YUE2_STORAGE_URL=s3://bucket/prefix   YUE2_S3_ENDPOINT_URL=http://minio:9000
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from yue2_jobs.core.paths import CHECKPOINTS
from yue2_jobs.decode.params import DEFAULT_MAX_NEW_TOKENS, DEFAULT_MODE, Mode

SHIPPED_VARIANTS: dict[str, Path] = {"base": CHECKPOINTS / "base", "legal": CHECKPOINTS / "legal"}


class Settings(BaseSettings):
    """Pipeline settings; each field is `YUE2_<NAME>` in the environment."""

    model_config = SettingsConfigDict(env_prefix="YUE2_", extra="ignore", frozen=True)

    # --- where things live
    home: Path = Field(Path(".yue2"), description="Directory of the embedded mode's database, queue and storage.")
    database_url: str | None = Field(None, description="SQLAlchemy URL; default: SQLite file in `home`.")
    broker_url: str = Field("filesystem://", description="Celery broker; `filesystem://` keeps it in `home`.")
    storage_url: str | None = Field(None, description="`s3://bucket/prefix` or `file:///dir`; default `home`/storage.")
    s3_endpoint_url: str | None = Field(None, description="S3 endpoint for MinIO or moto; None means AWS.")
    s3_region: str = Field("us-east-1", description="Region the S3 client signs for.")
    checkpoints: dict[str, Path] = Field(
        default_factory=lambda: dict(SHIPPED_VARIANTS),
        description="Variant name -> checkpoint directory, as JSON in the environment. Adds to the shipped `base` "
        "and `legal` (a name of theirs replaces that one) unless `checkpoints_only` is set.",
    )
    checkpoints_only: bool = Field(False, description="Serve only the variants `checkpoints` names, not the shipped "
                                   "ones beside them.")

    # --- job defaults and limits (each limit is reported by name in the 4xx that enforces it)
    default_variant: str = Field("base", description="Variant a job runs on when it names none.")
    # The decoding defaults are `DecodingParams`' own (yue2_jobs.decode.params), so the API, the CLI,
    # `DecodeSession.generate` and the engine agree unless an operator sets these.
    default_mode: Mode = Field(DEFAULT_MODE, description="Decoding mode a job runs in when it names none (auto: the "
                               "faster of ar and hybrid, which give the same tokens, as measured by the worker).")
    default_max_new_tokens: int = Field(DEFAULT_MAX_NEW_TOKENS, ge=1,
                                        description="Summary length cap when a job names none.")
    max_new_tokens_limit: int = Field(256, ge=1, description="Largest `max_new_tokens` a job may ask for.")
    # Large enough for a long document that `long_input=chunk` summarises window by window.
    max_input_chars: int = Field(100_000, ge=1, description="Largest `input`/`prompt` of one job, in characters.")
    max_batch_items: int = Field(50_000, ge=1, description="Most lines one batch input file may hold.")
    max_file_bytes: int = Field(200 * 1024 * 1024, ge=1, description="Largest upload to POST /v1/files.")
    max_request_bytes: int = Field(1024 * 1024, ge=1, description="Largest JSON request body.")
    tenant_max_in_flight: int = Field(
        16, ge=1, description="Requests one tenant may have in flight in one API process at once; more get 429 "
        "with Retry-After, so one tenant's retries cannot take the threads and database connections all share."
    )
    request_body_timeout_s: float = Field(
        30.0, gt=0, description="A JSON request body must be complete this long after its headers (else 408)."
    )
    file_body_timeout_s: float = Field(
        600.0, gt=0, description="An upload to POST /v1/files must be complete this long after its headers "
        "(else 408): 200 MiB at 350 KB/s."
    )
    max_header_bytes: int = Field(16 * 1024, ge=1024, description="Largest request headers, names and values "
                                  "together (431 above it).")
    inline_input_bytes: int = Field(8 * 1024, ge=0, description="Inputs above this go to storage, not the row.")
    inline_output_bytes: int = Field(8 * 1024, ge=0, description="Outputs up to this are kept in the row too.")

    # --- workers
    batch_max_jobs: int = Field(32, ge=1, description="A worker flushes its micro-batch at this many jobs ...")
    batch_flush_ms: int = Field(50, ge=1, description="... or after this many milliseconds.")
    max_attempts: int = Field(3, ge=1, description="Claims a job gets before it ends `failed` (poison jobs).")
    lease_s: float = Field(120.0, gt=0, description="A claim lasts this long unless its worker renews it.")
    visibility_timeout_s: int = Field(
        6 * 3600, ge=60, description="Redis redelivers an unacked task after this; above the longest backlog."
    )
    outage_retry_s: float = Field(
        300.0, gt=0, description="How long a worker retries recording results through a database or storage "
        "outage (with backoff) before it gives its jobs back: their leases expire and the reconciler reruns them."
    )
    reconcile_interval_s: float = Field(10.0, gt=0, description="How often a worker runs the reconciler.")
    reconcile_grace_s: float = Field(30.0, ge=0, description="A queued job is checked against the broker after this.")
    upload_abandoned_after_s: float = Field(
        3600.0, ge=60, description="An unfinished write to storage (an S3 multipart upload, a directory's temporary "
        "file) this old was left by a killed writer and is aborted by the sweep; far above the longest write."
    )
    upload_sweep_interval_s: float = Field(
        600.0, gt=0, description="How often the reconciling worker sweeps storage for abandoned writes."
    )
    fair_share_rows: int = Field(
        8, ge=0, description="A busy worker gives up to this many of its rows to queued jobs of tenants it is not "
        "serving (those waiting longest first), ahead of its own micro-batch, while each such tenant has fewer than "
        "this many of the variant's jobs running anywhere (0: off; `jobs.fair_share`)."
    )
    fair_share_poll_s: float = Field(
        0.5, gt=0, description="How often a busy worker looks for such tenants in Postgres."
    )
    runner: str = Field(
        "workers.runner:ModelRunner", description="`module:factory` building a worker's job runner."
    )
    worker_ready_file: Path | None = Field(None, description="A worker touches this file once it consumes tasks.")
    torch_threads: int | None = Field(None, ge=1, description="torch intra-op threads in a worker.")
    device: str = Field("auto", description="A worker's torch device: `auto` (CUDA when visible), `cpu`, `cuda`.")
    dtype: Literal["auto", "float32", "bfloat16", "float16", "int8"] = Field(
        "auto", description="A worker's weight dtype: `auto` is bfloat16 on CUDA and float32 on the CPU; `int8` "
                            "(CPU only) decodes with int8 matrices: 1.4-1.7x float32 at BART-base size, no faster on "
                            "the tiny shipped checkpoints, ROUGE-L -0.33 on their eval sets.")
    cuda_graphs: bool = Field(True, description="Capture the decode step in CUDA graphs at worker start (CUDA).")
    compile: bool = Field(True, description="Compile the CPU decode step ahead of time at worker start (CPU, "
                          "float32; needs a C++ compiler the first time, then cached per checkpoint version under "
                          "YUE2_COMPILE_CACHE); 0 decodes with the eager step.")
    batching: Literal["continuous", "static"] = Field(
        "continuous", description="`continuous`: greedy ar/hybrid jobs share decoder steps and refill finished "
        "rows at once; `static`: every micro-batch decodes to its longest row (the old path)."
    )
    engine_max_rows: int = Field(32, ge=1, description="Most sequences decoding at once in one worker.")
    engine_max_tokens: int | None = Field(
        None, ge=1, description="Most tokens (input + max_new_tokens of each live row) reserved at once; "
        "default engine_max_rows x 2 x the model's positions."
    )
    worker_procs: int = Field(1, ge=1, description="Worker processes on a host without GPUs (they split the cores).")
    upload_cpus: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, min_length=1, description="CPUs a worker's S3 upload helper processes run on, as JSON (e.g. [0, 1]); "
        "default: the worker's own. Their boto3 work (about 2 ms of CPU a job) then leaves the decoding thread's "
        "cores alone.")
    worker_restart_max_s: float = Field(60.0, gt=0, description="Longest backoff before a crashed worker restarts "
                                        "(and between two attempts to load a worker's checkpoint).")
    health_stall_s: float = Field(
        60.0, ge=0, description="/healthz answers 503 for a variant whose jobs have been queued this long with no "
        "live worker (none started, or each down on a checkpoint it cannot load).")
    worker_load_attempts: int = Field(
        5, ge=1, le=100, description="Attempts a worker makes to load its checkpoint at start (one log line each) "
        "before it stays down, its reason in its status row, until the variant's active version changes.")
    worker_load_backoff_s: float = Field(2.0, gt=0, description="Wait after a worker's first failed load; doubled "
                                         "after each next one, up to `worker_restart_max_s`.")
    metrics_host: str = Field("127.0.0.1", description="Address a worker's metrics endpoint binds (0.0.0.0 for a "
                              "Prometheus on another host).")
    metrics_port: int = Field(0, ge=0, le=65535, description="First worker's Prometheus port (0: no endpoint); "
                              "child i of the launcher serves metrics_port + i.")
    flower_port: int = Field(5555, ge=1, le=65535, description="Port `yue2 flower` binds.")
    flower_basic_auth: str | None = Field(None, description="`user:password` Flower requires (comma-separated).")

    render_max_chars: int = Field(2000, ge=1, le=100_000, description="Longest text a render_font job may render.")
    render_max_pixels: int = Field(16_000_000, ge=10_000, description="Largest PNG/SVG canvas (width x height) a "
                                   "render_font job may produce; a longer text fails naming the size.")

    # --- checkpoint registry
    checkpoint_store_url: str | None = Field(
        None, description="Where published checkpoints live (`s3://bucket/prefix` or `file:///dir`); "
        "default `home`/checkpoint-store. Versions go under checkpoints/<variant>/<version>/."
    )
    checkpoint_cache_dir: Path | None = Field(None, description="Local copies of published versions; "
                                              "default `home`/checkpoint-cache.")

    validation_min_rouge_l: dict[str, float] = Field(
        default_factory=dict, description="Variant -> minimum ROUGE-L F1 x 100 a new version must reach on the "
        "first `validation_rouge_items` items of its eval set (`validation_eval_sets`); a variant not listed has "
        "no ROUGE gate. JSON, e.g. YUE2_VALIDATION_MIN_ROUGE_L='{\"legal\": 30}'.")
    validation_eval_sets: dict[str, str] = Field(
        default_factory=lambda: {"base": "general", "legal": "legal"},
        description="Variant -> corpus under data/ whose eval split the ROUGE gate decodes.")
    validation_rouge_items: int = Field(16, ge=1, le=1000, description="Eval items the ROUGE gate and an expected "
                                        "change (`--expect-change`) decode.")
    # The gate every new version passes (checkpoints/gates.py), on with these defaults for every variant.
    validation_canary_items: int = Field(
        16, ge=1, le=1000, description="Inputs a new version and the serving one both decode: the variant's latest "
        "jobs' inputs, topped up from its eval set and the smoke prompts.")
    validation_min_agreement: float = Field(
        0.5, ge=0, le=1, description="Least mean ROUGE-L F1 of a new version's canary outputs against the serving "
        "version's (a publish without --expect-change).")
    validation_max_loss_gap: float = Field(
        1.0, ge=0, description="Most a new version's mean loss (nats per token) on the serving version's canary "
        "outputs may exceed the serving version's own.")
    validation_max_degenerate: float = Field(
        0.25, ge=0, le=1, description="Largest share of a new version's outputs that may be empty, mostly replacement "
        "characters, one token repeated or a short loop (and no more than the serving version's).")
    validation_max_draft_drop: float = Field(
        0.25, ge=0, le=1, description="How far a new version's drafter may fall under the serving version's (the "
        "agreement of its hybrid_fast outputs with its own ar outputs) while under `validation_min_agreement`.")
    validation_max_rouge_drop: float = Field(
        2.0, ge=0, description="With --expect-change: most ROUGE-L points (x 100) a new version may fall under the "
        "serving version on the variant's eval set.")

    watchdog_interval_s: float = Field(5.0, gt=0, description="Seconds between watchdog passes (a local store "
                                       "also wakes it on each new manifest).")
    watchdog_swap_timeout_s: float = Field(600.0, gt=0, description="How long the watchdog waits for one worker "
                                           "to load and serve a new version.")

    # --- API
    api_host: str = Field("127.0.0.1", description="Address `yue2 api` binds.")
    api_port: int = Field(8000, ge=0, le=65535, description="Port `yue2 api` binds; the CLI calls it there too, so "
                          "moving the API takes this one setting.")
    api_url: str | None = Field(None, description="The API's URL for the CLI and the Python client, with or "
                                "without /v1, when it is not where `api_host` and `api_port` say (another host, "
                                "a proxy); default: `client_api_url`.")
    header_timeout_s: float = Field(15.0, gt=0, description="A client must send a request's headers within this "
                                    "many seconds of connecting or of its previous response (slowloris).")
    keep_alive_s: int = Field(5, ge=1, description="An idle keep-alive connection is closed after this many seconds.")
    presign_expiry_s: int = Field(3600, ge=1, description="Lifetime of presigned output URLs.")
    metrics_token: str | None = Field(None, min_length=16, description="Bearer token the API's /metrics requires "
                                      "(its job counts span every tenant); unset, /metrics is off.")

    # --- webhooks (Standard Webhooks; the default schedule is theirs: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h)
    webhook_allow_private: bool = Field(False, description="Allow webhook URLs on private, loopback and "
                                        "link-local addresses (off: such URLs are refused, against SSRF).")
    webhook_max_endpoints: int = Field(16, ge=1, le=1000, description="Most webhook endpoints per tenant.")
    webhook_timeout_s: float = Field(10.0, gt=0, le=60, description="How long one delivery attempt may take.")
    webhook_retry_s: list[float] = Field(
        default_factory=lambda: [5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0],
        description="Waits before each retry of a failed delivery, as JSON; the last one repeats.")
    webhook_max_age_s: float = Field(86400.0, gt=0, description="A delivery is given up this long after its event.")
    webhook_poll_s: float = Field(2.0, gt=0, description="How often a worker sends due webhook deliveries.")

    @model_validator(mode="after")
    def _check(self) -> Self:
        if "checkpoints" in self.model_fields_set and not self.checkpoints_only:
            # The model is frozen once built; this is its construction.
            object.__setattr__(self, "checkpoints", {**SHIPPED_VARIANTS, **self.checkpoints})
        if self.default_variant not in self.checkpoints:
            raise ValueError(f"YUE2_DEFAULT_VARIANT={self.default_variant!r} is not in YUE2_CHECKPOINTS "
                             f"({sorted(self.checkpoints)})")
        if self.default_max_new_tokens > self.max_new_tokens_limit:
            raise ValueError("YUE2_DEFAULT_MAX_NEW_TOKENS exceeds YUE2_MAX_NEW_TOKENS_LIMIT")
        if self.api_url is not None:
            normalize_api_url(self.api_url, setting="YUE2_API_URL")  # refused at start, not at the first call
        if self.visibility_timeout_s < 4 * self.lease_s:
            # Redis redelivering a task whose worker still holds a live claim only wastes a delivery
            # (the claim guard makes it a no-op), but it must not happen on every long batch.
            raise ValueError("YUE2_VISIBILITY_TIMEOUT_S must be at least 4 x YUE2_LEASE_S")
        return self

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.home / 'yue2.db').resolve()}"

    @property
    def resolved_storage_url(self) -> str:
        return self.storage_url or (self.home / "storage").resolve().as_uri()

    @property
    def resolved_checkpoint_store_url(self) -> str:
        return self.checkpoint_store_url or (self.home / "checkpoint-store").resolve().as_uri()

    @property
    def resolved_checkpoint_cache_dir(self) -> Path:
        return (self.checkpoint_cache_dir or self.home / "checkpoint-cache").resolve()

    @property
    def queue_dir(self) -> Path:
        return (self.home / "queue").resolve()

    @property
    def client_api_url(self) -> str:
        """Where a client on this machine reaches the API, without /v1: `api_url` when set, else the
        address `yue2 api` binds (`api_host`, `api_port`), a wildcard address read as loopback."""
        if self.api_url is not None:
            return normalize_api_url(self.api_url, setting="YUE2_API_URL")
        if self.api_port == 0:
            raise ValueError("YUE2_API_PORT=0 lets `yue2 api` pick a free port, which a client cannot know: set "
                             "YUE2_API_URL (or pass --api-url)")
        host = LOOPBACK_FOR_WILDCARD.get(self.api_host, self.api_host)
        return f"http://{f'[{host}]' if ':' in host else host}:{self.api_port}"


# A server bound to every address is reached, from its own machine, on loopback.
LOOPBACK_FOR_WILDCARD = {"0.0.0.0": "127.0.0.1", "::": "127.0.0.1", "": "127.0.0.1"}
API_PREFIX = "/v1"  # every route of the API but /healthz, /metrics and /ui


def normalize_api_url(url: str, *, setting: str = "--api-url") -> str:
    """The API's base URL as the CLI and `Client` use it: scheme and host, no trailing slash and no
    `/v1` (the routes add it); `http://` when no scheme is given. The `openai` client wants the
    same URL with `/v1`: `openai_base_url`."""
    text = url.strip()
    if "://" not in text:
        text = f"http://{text}"
    scheme, _, rest = text.partition("://")
    text = f"{scheme.lower()}://{rest}".rstrip("/")
    if text.endswith(API_PREFIX):
        text = text[: -len(API_PREFIX)].rstrip("/")
    if scheme.lower() not in ("http", "https") or not text.partition("://")[2] or any(c in text for c in "?# "):
        raise ValueError(f"{setting}={url!r} is not the API's URL: want http(s)://host:port, with or without /v1")
    return text


def openai_base_url(api_url: str) -> str:
    """The `base_url` the `openai` client takes for the API at `api_url`: it must end in /v1."""
    return normalize_api_url(api_url) + API_PREFIX


@lru_cache
def get_settings() -> Settings:
    return Settings()


def settings_or_exit(program: str) -> Settings:
    """The settings for a command-line program: a bad `YUE2_*` variable ends it with the reason."""
    from pydantic import ValidationError

    try:
        return Settings()
    except ValidationError as exc:
        raise SystemExit(f"{program}: invalid configuration: {exc}") from None
