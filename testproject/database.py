"""Find a PostgreSQL server for the tests and the demo, starting an embedded one if need be.

In order: ``DATABASE_URL`` if set; else the local server on 127.0.0.1:5432 if it answers; else an
embedded server from the ``pgserver`` package, kept in ``.pgdata/`` beside this project. The URL
found is exported as ``DATABASE_URL`` so that worker subprocesses use the same server.
Set ``PGOUTBOX_EMBEDDED=1`` to skip the local server (CI does, to keep the embedded path true).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

PROJECT_ROOT = Path(__file__).resolve().parent.parent
EMBEDDED_DATA = PROJECT_ROOT / ".pgdata"
LOCAL_URL = "postgres://postgres@127.0.0.1:5432/postgres"


def database_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    if os.environ.get("PGOUTBOX_EMBEDDED") != "1" and _answers("127.0.0.1", 5432):
        url = LOCAL_URL
    else:
        url = _start_embedded()
    os.environ["DATABASE_URL"] = url
    return url


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _start_embedded() -> str:
    try:
        from pgserver import get_server  # type: ignore[attr-defined]
    except ImportError as exc:  # pragma: no cover - only without the test extra
        raise RuntimeError(
            "No PostgreSQL server found (DATABASE_URL is unset and 127.0.0.1:5432 does not "
            "answer), and the embedded one needs the 'pgserver' package: "
            "pip install 'django-pgoutbox[test]'"
        ) from exc
    # It stops when the last process that started it exits; worker subprocesses reach it through
    # the exported DATABASE_URL. Its socket lives in the data directory: it takes no TCP port.
    server = get_server(EMBEDDED_DATA, cleanup_mode="stop")
    uri: str = server.get_uri()
    return uri


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
