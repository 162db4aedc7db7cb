"""A worker takes its node name before its model loads, and refuses one a live process serves: on
this host the pid tells; a row another host wrote (two hosts with one hostname) is live while it
reports, since its pid means nothing here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.sqlite_db import sessions  # noqa: F401 - fixture
from workers.status_row import claim_node_name
from yue2_jobs.core.procs import pid_space
from yue2_jobs.db.models import WorkerProcess
from yue2_jobs.db.session import as_utc, utcnow


def _row(factory: sessionmaker[Session], name: str, *, pid: int, space: str | None, age_s: float) -> None:
    with factory() as session:
        session.merge(WorkerProcess(name=name, variant="base", checkpoint="base@v", pid=pid, pid_space=space,
                                    heartbeat_at=utcnow() - timedelta(seconds=age_s)))
        session.commit()


def _refuses(factory: sessionmaker[Session], name: str) -> str | None:
    with factory() as session:
        try:
            claim_node_name(session, name, variant="base")
        except SystemExit as exc:
            return str(exc)
    return None


def test_a_live_namesake_on_another_host_is_refused_until_it_goes_silent(
        sessions: sessionmaker[Session]) -> None:  # noqa: F811
    _row(sessions, "base-cpu0@clone", pid=os.getpid(), space="other-boot/4026531836", age_s=2)
    message = _refuses(sessions, "base-cpu0@clone")
    assert message is not None and "in use by a worker on another host" in message and "--host" in message
    _row(sessions, "base-cpu0@clone", pid=os.getpid(), space="other-boot/4026531836", age_s=120)
    assert _refuses(sessions, "base-cpu0@clone") is None  # that host went away
    with sessions() as session:  # and the name is ours now, before any model has loaded
        row = session.get(WorkerProcess, "base-cpu0@clone")
        assert row is not None and (row.pid, row.pid_space, row.checkpoint) == (os.getpid(), pid_space(),
                                                                                 "base@starting")
        age = (utcnow() - as_utc(row.heartbeat_at)).total_seconds()
        assert age < 5


def test_on_this_host_the_pid_tells(sessions: sessionmaker[Session]) -> None:  # noqa: F811
    assert _refuses(sessions, "base-cpu0@fresh") is None  # a name nobody had
    assert _refuses(sessions, "base-cpu0@fresh") is None  # ours already (the same pid): taken again
    _row(sessions, "base-cpu0@here", pid=os.getppid(), space=pid_space(), age_s=0)
    message = _refuses(sessions, "base-cpu0@here")
    assert message is not None and "already served by the live process" in message
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _row(sessions, "base-cpu0@here", pid=gone.pid, space=pid_space(), age_s=0)
    assert _refuses(sessions, "base-cpu0@here") is None  # a restart under the same name
    _row(sessions, "base-cpu0@old", pid=gone.pid, space=None, age_s=0)  # written before pid spaces were kept
    assert _refuses(sessions, "base-cpu0@old") is None


def test_pid_space_is_shared_by_this_host_and_not_by_another_pid_namespace() -> None:
    code = ["-c", "from yue2_jobs.core.procs import pid_space; print(pid_space())"]
    here = subprocess.run([sys.executable, *code], capture_output=True, text=True, check=True).stdout.strip()
    assert here == pid_space()
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a pid namespace of its own needs root and unshare")
    other = subprocess.run(["unshare", "--pid", "--fork", "--mount", "--mount-proc", sys.executable, *code],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert other != here and other.split("/")[0] == here.split("/")[0]  # same kernel, other process table
