"""Real ``runworkers`` processes for tests: started on the test database, stopped at teardown.

Also the suite's waits. Every wait is on a condition with a deadline, and every deadline is
scaled by ``PGOUTBOX_TEST_TIME_SCALE`` (default 1): a busy machine (CI, ``./run stress``) raises it
instead of a test growing its own allowance.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.db import connections

ROOT = Path(__file__).resolve().parents[2]


def _time_scale() -> float:
    raw = os.environ.get("PGOUTBOX_TEST_TIME_SCALE", "1")
    try:
        scale = float(raw)
    except ValueError:
        raise RuntimeError(f"PGOUTBOX_TEST_TIME_SCALE must be a number >= 1, not {raw!r}") from None
    if not scale >= 1:
        raise RuntimeError(f"PGOUTBOX_TEST_TIME_SCALE must be a number >= 1, not {raw!r}")
    return scale


#: How much longer than on an idle machine every deadline of the suite is.
TIME_SCALE = _time_scale()


def seed_or(default: int) -> int:
    """The seed of a test's random choices: ``PGOUTBOX_TEST_SEED`` if set (``./run stress`` sets
    one per round and reports it with each failure), else the test's own ``default``."""
    raw = os.environ.get("PGOUTBOX_TEST_SEED")
    return int(raw) if raw else default


def scaled(seconds: float) -> float:
    """A deadline of ``seconds`` on an idle machine, as long as this run allows."""
    return seconds * TIME_SCALE


def database_url_for_tests(alias: str = "default") -> str:
    """A URL for the database this test session uses (pytest-django's test database)."""
    s = connections[alias].settings_dict
    auth = quote(s["USER"] or "postgres")
    if s["PASSWORD"]:
        auth += ":" + quote(s["PASSWORD"])
    host = s["HOST"] or ""
    if host.startswith("/"):
        return f"postgres://{auth}@/{quote(s['NAME'])}?host={quote(host)}"
    port = f":{s['PORT']}" if s["PORT"] else ""
    return f"postgres://{auth}@{host or 'localhost'}{port}/{quote(s['NAME'])}"


#: Run before the worker (it execs it, keeping the pid): SIGKILL the worker when the test process
#: dies, so that a run cut short (Ctrl-C twice, ``./run stress`` stopped) leaves no worker behind
#: on the test database. util-linux's ``setpriv``, where there is one.
_DIE_WITH_THE_TEST = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []


class WorkerProcess:
    def __init__(
        self,
        args: list[str],
        settings: dict[str, Any],
        log: Path,
        database_url: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        #: Every connection the process opens carries this name (libpq's ``PGAPPNAME``), so that a
        #: test can tell when the last of its backends is gone.
        self.application_name = f"pgoutbox-test-{uuid.uuid4().hex[:12]}"
        env = {
            **os.environ,
            "PGAPPNAME": self.application_name,
            "DATABASE_URL": database_url or database_url_for_tests(),
            "PGOUTBOX_TEST_SETTINGS": json.dumps(settings),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.log_path = log
        self._log = log.open("w")
        self.process = subprocess.Popen(
            [*_DIE_WITH_THE_TEST, sys.executable, str(ROOT / "manage.py"), "runworkers", *args],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as in a terminal or under systemd
        )
        self.pid = self.process.pid

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float) -> int:
        """Its exit status, once it has exited (within ``timeout`` seconds, scaled)."""
        return self.process.wait(timeout=scaled(timeout))

    def kill(self) -> None:
        """SIGKILL it, and return once its exit *and* the end of each of its backends are seen.

        A backend outlives its killed client until its statement is done: an outcome write or a
        claim in flight still commits after the process is gone. Only then is what the process
        left in the tables final.
        """
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=scaled(10))
        self.wait_for_backends_to_end()

    def backends(self, where: str = "true") -> int:
        """How many of this process's connections the server still has (matching ``where``)."""
        with connections["default"].cursor() as cursor:
            cursor.execute(
                f"SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND ({where})",
                [self.application_name],
            )
            return int(cursor.fetchone()[0])

    def listening(self) -> bool:
        """Whether one of its connections is waiting on LISTEN (its last statement)."""
        return self.backends("state = 'idle' AND query ILIKE 'LISTEN%%'") > 0

    def in_transaction(self) -> bool:
        """Whether one of its connections is inside a transaction now."""
        return self.backends("xact_start IS NOT NULL") > 0

    def idle(self) -> bool:
        """Whether it has connections and every one of them is idle (no statement running)."""
        return self.backends() > 0 and self.backends("state <> 'idle'") == 0

    def wait_for_backends_to_end(self) -> None:
        def backends_gone() -> bool:
            """every backend of the killed process has ended"""
            return self.backends() == 0

        wait_for(backends_gone, timeout=30)

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=scaled(10))
        self._log.close()


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``manage.py runworkers ARGS`` with ``PGOUTBOX`` overrides; killed at teardown."""
    started: list[WorkerProcess] = []

    def start(
        *args: str,
        database_url: str | None = None,
        env: dict[str, str] | None = None,
        **settings: Any,
    ) -> WorkerProcess:
        # The job role alone unless a test asks for others: a scheduler would add maintenance
        # jobs to the queues that the test counts.
        arguments = list(args) if "--roles" in args else ["--roles", "jobs", *args]
        worker = WorkerProcess(
            arguments, settings, tmp_path / f"worker-{len(started)}.log", database_url, env
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
        # Shown by pytest only when the test failed: what each process said, last lines first.
        lines = worker.log_path.read_text(errors="replace").splitlines()
        print(f"--- {worker.log_path.name} (pid {worker.pid}), last 40 of {len(lines)} lines:")
        print("\n".join(lines[-40:]))


def wait_for(condition: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds
    (scaled by ``PGOUTBOX_TEST_TIME_SCALE``)."""
    limit = scaled(timeout)
    deadline = time.monotonic() + limit
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    raise AssertionError(
        f"condition not met within {limit:g}s (last value {value!r}): "
        f"{condition.__doc__ or condition}"
    )


def holds_for(condition: Callable[[], Any], seconds: float, interval: float = 0.05) -> None:
    """Check that ``condition`` stays truthy for ``seconds`` (scaled), failing the first time it
    is not: a wait for something *not* to happen, which a sleep before one look would miss."""
    deadline = time.monotonic() + scaled(seconds)
    while True:
        assert condition(), f"no longer true: {condition.__doc__ or condition}"
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)


def other_backends(where: str, count: str = "*") -> int:
    """``count(<count>)`` over this test database's other backends matching ``where`` (SQL).

    ``count="pg_terminate_backend(pid)"`` terminates them and says how many there were.
    """
    with connections["default"].cursor() as cursor:
        cursor.execute(
            f"SELECT count({count}) FROM pg_stat_activity WHERE ({where}) "
            "AND datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def completed_jobs() -> int:
    """How many jobs of the test database are completed."""
    from django_pgoutbox.models import Job, JobStatus

    return Job.objects.filter(status=JobStatus.COMPLETED).count()
