"""Real ``runworkers`` processes for tests: started on the test database, stopped at teardown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.db import connections

ROOT = Path(__file__).resolve().parent.parent


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


class WorkerProcess:
    def __init__(
        self,
        args: list[str],
        settings: dict[str, Any],
        log: Path,
        database_url: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        env = {
            **os.environ,
            "DATABASE_URL": database_url or database_url_for_tests(),
            "PGOUTBOX_TEST_SETTINGS": json.dumps(settings),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.log_path = log
        self._log = log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runworkers", *args],
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
        return self.process.wait(timeout=timeout)

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=10)
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


def wait_for(condition: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s: {condition.__doc__ or condition}")


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
