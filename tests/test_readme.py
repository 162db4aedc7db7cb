"""The README, run as a newcomer runs it: every fenced `sh` block, in order, in one shell, from a
fresh checkout's point of view (the venv exists: `make test` made it), against the real Postgres
with a scratch database and a Redis server of this test's own (tests/scratch_redis.py). Two things differ from a
person at a terminal, both here in the open: `make test` runs as `make -n test` (this test is part
of `make test`; running it would recurse), `make demo` submits 8 summaries instead of 200, and
`yue2 train-drafter` trains on 160 texts for 40 + 10 steps instead of 2,000 + 300 (minutes). The
README's own model (`BART_DIR`) is shipped base's AR path exported as a BART directory, and its
texts (`MY_TEXTS`) the general eval set.
Blocks marked `sh docker` need Docker and are the only ones skipped. The environment points the
commands at this test's own database, Redis server, ports and temporary directory (variables
the README's commands read), so the run never meets another test's state, and it runs beside the
other tests rather than in the serial server phase. `make demo` here is also the test of the
embedded demo end to end."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.pipeline.conftest import PG_ADMIN_URL, free_port, service_unavailable
from tests.scratch_redis import ScratchRedis, ScratchRedisError

pytestmark = pytest.mark.slow  # real services and subprocesses: not in `make test-fast`
ROOT = Path(__file__).resolve().parents[1]
PRELUDE = """set -euo pipefail
make() { if [ "$*" = "test" ]; then command make -n test; else command make "$@"; fi; }
yue2() {  # in a background job or $(...) it execs, so `kill %1` reaches the program itself
  local extra=()
  if [ "${1:-}" = train-drafter ]; then extra=(--max-inputs 160 --steps 40 --confidence-steps 10); fi
  if [ "$BASHPID" = "$$" ]; then command yue2 "$@" "${extra[@]}"; else exec yue2 "$@" "${extra[@]}"; fi
}
"""


def readme_blocks() -> list[tuple[str, str]]:
    """(info string, body) of every fenced block whose info string starts with `sh`."""
    return [(m.group(1).strip(), m.group(2)) for m in
            re.finditer(r"^```(sh[^\n]*)\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)]


def test_the_readme_has_its_two_commands_first_and_stays_short() -> None:
    first = readme_blocks()[0][1].splitlines()
    assert [line.split("#")[0].strip() for line in first] == ["make demo", "make test"]
    assert len((ROOT / "README.md").read_text().splitlines()) < 250


def test_the_readmes_own_model_settings_are_valid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's way to serve a converted model: its variables, as written, make valid settings."""
    from yue2_jobs.core.config import Settings

    line = re.search(r"`(YUE2_CHECKPOINTS='[^']+' YUE2_DEFAULT_VARIANT=\w+)`", (ROOT / "README.md").read_text())
    assert line is not None
    for part in shlex.split(line.group(1)):
        monkeypatch.setenv(*part.split("=", 1))
    settings = Settings(home=tmp_path)
    assert settings.default_variant == "cnn" and settings.default_variant in settings.checkpoints


def _postgres() -> None:
    """Postgres on 127.0.0.1 (and redis-server, below): skipped locally without them, a failure
    under CI=true."""
    try:
        create_engine(PG_ADMIN_URL).connect().close()
    except Exception as exc:
        service_unavailable("Postgres at 127.0.0.1:5432", exc)


def _bart_dir(path: Path) -> Path:
    """Shipped base's AR path as a Hugging Face BART directory: what a user brings."""
    from yue2_jobs.model.checkpoint import load_checkpoint
    from yue2_jobs.model.convert import bart_from_yue2

    model, tokenizer = load_checkpoint(ROOT / "checkpoints" / "base")
    bart_from_yue2(model).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_every_command_block_of_the_readme_runs(tmp_path: Path) -> None:
    _postgres()
    try:
        redis_server = ScratchRedis.start()
    except ScratchRedisError as exc:
        service_unavailable("a Redis server of the test's own", exc)
    try:
        _run_the_readme(tmp_path, redis_server)
    finally:
        redis_server.stop()


def _run_the_readme(tmp_path: Path, redis_server: ScratchRedis) -> None:
    blocks = [body for info, body in readme_blocks() if info != "sh docker"]
    assert len(blocks) >= 5 and any("yue2 stack up" in b for b in blocks)
    script = tmp_path / "readme.sh"
    script.write_text(PRELUDE + "\n".join(blocks))
    database = f"yue2_readme_{uuid.uuid4().hex[:8]}"
    api_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("YUE2_", "AWS_"))}
    env.update(YUE2_DATABASE_URL=PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{database}",
               YUE2_BROKER_URL=redis_server.url(0), YUE2_STACK_S3_PORT=str(free_port()),
               YUE2_API_PORT=str(api_port), DEMO_ITEMS="8",  # the port alone moves the CLI too
               YUE2_COMPILE="0",  # no C++ build at the workers' start (tests/decode/test_compiled.py covers it)
               TMPDIR=str(tmp_path),  # the README's `mktemp -d` lands here
               BART_DIR=str(_bart_dir(tmp_path / "bart")), MY_TEXTS=str(ROOT / "data" / "general" / "eval.jsonl.gz"))
    log = tmp_path / "readme.log"
    proc = subprocess.Popen(["bash", str(script)], cwd=ROOT, env=env, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = proc.wait(600)
        out = log.read_text()
        assert code == 0, out[-4000:]
        assert re.search(r'"status": "completed", "request_counts": \{"total": 2, "completed": 2, "failed": 0\}', out)
        for custom_id in ("pool", "retry"):  # `yue2 results` printed one output line for each
            assert out.count(f'"custom_id": "{custom_id}", "error": null, "response": {{"status_code": 200') == 1
        assert '"status": "succeeded"' in out  # the curl job
        assert out.count('"decoding": {"mode": "') == 2  # an output line's mode where a job's view has it
        assert out.count("stack: stopped moto") == 2
        # Bring your own model: a drafter trained, the AR weights checked, published, compared, served.
        assert out.count("live tau") == 2 and "saved my-model-drafted (encoder and AR weights byte-identical" in out
        assert re.search(r"active: mine@\w+", out)
        assert re.search(r"\(paired, control mine-ar\): 4 finished jobs", out), out[-4000:]
        # `make demo` (8 summaries): the embedded pipeline ran every job, on both variants.
        assert "SQLite database, filesystem queue, local storage" in out
        assert out.split("p50 job latency s\n", 1)[1].split()[:2] == ["8", "0"]  # jobs succeeded, failed
        assert "base@" in out and "legal@" in out
        assert "Traceback" not in out, out[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        # `yue2 stack up` starts moto in a session of its own; `yue2 stack down` stops it, unless
        # the script failed before it.
        subprocess.run(["pkill", "-f", f"moto_server -H 127.0.0.1 -p {env['YUE2_STACK_S3_PORT']}"], check=False)
        admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        admin.dispose()
