"""How a statement takes its parameters: as ``%s``/``%(name)s`` (text, what Django's cursors
send) or as ``%b``/``%(name)b`` (binary, for a psycopg cursor with server-side parameters)."""

from __future__ import annotations

import re

_PLACEHOLDER = re.compile(r"%(\([a-z_]+\))?s")


def binary(sql: str) -> str:
    """``sql`` with every parameter sent in binary: ``%s`` becomes ``%b``, ``%(name)s``
    ``%(name)b``. psycopg then writes arrays without quoting each element in Python."""
    return _PLACEHOLDER.sub(lambda match: f"%{match.group(1) or ''}b", sql)
