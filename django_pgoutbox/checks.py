"""System checks, with stable ids (docs/settings.md lists them).

- ``pgoutbox.E001``: a database that holds the app's tables is not PostgreSQL.
- ``pgoutbox.E002``: the PostgreSQL driver is psycopg 2; psycopg 3 is required.
- ``pgoutbox.E003``: ``PGOUTBOX`` (or a section of it) is not a dict, or has an unknown key.
- ``pgoutbox.E004``: a ``PGOUTBOX`` value is invalid.
- ``pgoutbox.E005``: a registered job type names a queue that ``PGOUTBOX['QUEUES']`` lacks.
- ``pgoutbox.E006``: the PostgreSQL server is older than 15 (needs ``check --database``).
- ``pgoutbox.E007``: a schedule is invalid (bad cron, unknown job type or queue, bad option).
- ``pgoutbox.W001``: autovacuum is off on the server (needs ``check --database``).
- ``pgoutbox.E008``: ``PGOUTBOX['VIEWS_AUTH']['CALLABLE']`` cannot be imported, or is not
  callable.
- ``pgoutbox.W002``: a database seems to sit behind a transaction-pooling proxy, and
  ``PGOUTBOX['LISTEN_DATABASES']`` gives it no direct connection for LISTEN.
- ``pgoutbox.W003``: ``PGOUTBOX['VIEWS_AUTH']['BEARER_TOKEN_ENV']`` names a variable that is
  unset here or holds a token too short to be accepted: no token is.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, router
from django.db.utils import load_backend

from django_pgoutbox import queries

MIN_SERVER_VERSION = 150000


def _our_databases(databases: Sequence[str] | None = None) -> list[str]:
    from django_pgoutbox.models import Job

    aliases = databases if databases is not None else list(settings.DATABASES)
    return [alias for alias in aliases if router.allow_migrate_model(alias, Job)]


def postgresql_databases() -> list[str]:
    """The aliases of PostgreSQL databases that hold the app's tables (by their settings: no
    connection is opened)."""
    return [
        alias
        for alias in _our_databases()
        if _vendor(settings.DATABASES[alias].get("ENGINE", "")) == "postgresql"
    ]


def _vendor(engine: str) -> str:
    """The vendor of a backend, from its class: no connection is opened."""
    try:
        vendor: str = load_backend(engine).DatabaseWrapper.vendor
    except ImproperlyConfigured:
        return "unknown"
    return vendor


def check_settings(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[CheckMessage]:
    from django_pgoutbox.conf import settings_problems

    return [
        Error(f"{problem.key} {problem.message}", hint=problem.hint, id=problem.check_id)
        for problem in settings_problems()
    ]


def check_database_engines(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for alias in _our_databases():
        engine = settings.DATABASES[alias].get("ENGINE", "")
        if _vendor(engine) != "postgresql":
            errors.append(
                Error(
                    f"DATABASES[{alias!r}] uses {engine!r}; django-pgoutbox needs PostgreSQL.",
                    hint="Set ENGINE to 'django.db.backends.postgresql', or route the "
                    "pgoutbox app away from this database with a database router.",
                    id="pgoutbox.E001",
                )
            )
    return errors


def check_driver(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[CheckMessage]:
    engines = [settings.DATABASES[alias].get("ENGINE", "") for alias in _our_databases()]
    if not any(_vendor(engine) == "postgresql" for engine in engines):
        return []
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if is_psycopg3:
        return []
    return [
        Error(
            "Django is using psycopg 2; django-pgoutbox needs psycopg 3.",
            hint="pip install 'psycopg[binary]' (or 'psycopg[c]'); Django prefers psycopg 3 "
            "when both are installed.",
            id="pgoutbox.E002",
        )
    ]


def check_job_queues(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[CheckMessage]:
    from django_pgoutbox.conf import settings_problems
    from django_pgoutbox.registry import registered_jobs

    if settings_problems():
        return []  # check_settings reports those; queue names may not be known
    from django_pgoutbox.conf import get_settings

    queues = get_settings().queues
    return [
        Error(
            f"Job type {definition.name!r} uses queue {definition.queue!r}, which "
            "PGOUTBOX['QUEUES'] does not configure.",
            hint=f"Add {definition.queue!r} to PGOUTBOX['QUEUES'] or pass another queue= "
            f"to @job. Configured: {', '.join(queues) or 'none'}.",
            obj=definition.func,
            id="pgoutbox.E005",
        )
        for definition in registered_jobs().values()
        # The built-in maintenance jobs run on PGOUTBOX['MAINTENANCE_QUEUE'], set per schedule.
        if definition.queue not in queues and not definition.name.startswith("pgoutbox.")
    ]


def check_pooling_proxy(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """Warn where LISTEN (session state) would go through a transaction-pooling proxy.

    A proxy in transaction mode hands each transaction to any server connection: a LISTEN
    registered in one is heard by whatever client holds that connection next, or by nobody.
    The signs looked for are those of PgBouncer: its default port, and the setting Django's
    documentation asks for behind it (``DISABLE_SERVER_SIDE_CURSORS``).
    """
    from django_pgoutbox.conf import settings_problems

    if settings_problems():
        return []
    from django_pgoutbox.conf import get_settings
    from django_pgoutbox.db import pooling_signs

    conf = get_settings()
    if not conf.notify:
        return []  # no wake-ups are sent, so no LISTEN connection is ever made
    listen = conf.listen_databases
    warnings: list[CheckMessage] = []
    for alias in _our_databases():
        config = settings.DATABASES[alias]
        if alias in listen or _vendor(config.get("ENGINE", "")) != "postgresql":
            continue
        signs = pooling_signs(alias)
        if signs:
            warnings.append(
                Warning(
                    f"DATABASES[{alias!r}] looks like a transaction-pooling proxy "
                    f"({', '.join(signs)}): runworkers' LISTEN connection would not receive "
                    "wake-ups through it, and workers would fall back to polling.",
                    hint=f"Add a DATABASES entry with a direct connection to the same server "
                    f"and set PGOUTBOX['LISTEN_DATABASES'] = {{{alias!r}: 'direct_alias'}}; "
                    f"or map {alias!r} to itself if it is in fact a direct connection. "
                    "Claims, limits and schedules take only transaction-scoped locks and work "
                    "through the proxy.",
                    id="pgoutbox.W002",
                )
            )
    return warnings


def check_schedules(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[CheckMessage]:
    from django_pgoutbox.conf import settings_problems

    if settings_problems():
        return []
    from django_pgoutbox.schedules import load_schedules

    _, problems = load_schedules()
    return [
        Error(
            str(problem),
            hint="See docs/scheduling.md for the keys of a schedule.",
            id="pgoutbox.E007",
        )
        for problem in problems
    ]


def check_server_version(
    app_configs: Sequence[AppConfig] | None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for alias in _our_databases(databases or []):
        connection = connections[alias]
        if connection.vendor != "postgresql":
            continue
        with connection.cursor() as cursor:
            cursor.execute(queries.AUTOVACUUM_ON)
            if not cursor.fetchone()[0]:
                errors.append(
                    Warning(
                        f"DATABASES[{alias!r}] has autovacuum off: the jobs and outbox_events "
                        "tables will bloat with dead row versions, and claims slow down.",
                        hint="Turn autovacuum on (the tables' own settings make it aggressive), "
                        "or VACUUM them on a schedule.",
                        id="pgoutbox.W001",
                    )
                )
        version = connection.pg_version  # type: ignore[attr-defined]
        if version < MIN_SERVER_VERSION:
            errors.append(
                Error(
                    f"DATABASES[{alias!r}] is PostgreSQL {version // 10000}; django-pgoutbox "
                    "needs 15 or newer.",
                    hint="The idempotency index uses NULLS NOT DISTINCT, new in PostgreSQL 15.",
                    id="pgoutbox.E006",
                )
            )
    return errors


def check_views_auth(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[CheckMessage]:
    """What ``VIEWS_AUTH`` names must be there: the callable, the token."""
    from django_pgoutbox.conf import MIN_TOKEN_LENGTH, get_settings, settings_problems

    if settings_problems():
        return []
    rules = get_settings().views_auth
    messages: list[CheckMessage] = []
    if isinstance(rules.check, str):
        from django_pgoutbox.views import resolve_check

        try:
            resolve_check(rules.check)
        except ImproperlyConfigured as error:
            messages.append(
                Error(
                    str(error),
                    hint="Give the dotted path of a function request -> bool, or the function.",
                    id="pgoutbox.E008",
                )
            )
    if rules.bearer_token_env:
        token = os.environ.get(rules.bearer_token_env, "")
        if len(token) < MIN_TOKEN_LENGTH:
            state = f"holds {len(token)} characters" if token else "is not set"
            messages.append(
                Warning(
                    f"PGOUTBOX['VIEWS_AUTH']['BEARER_TOKEN_ENV'] names "
                    f"{rules.bearer_token_env!r}, which {state}: the views accept no token "
                    f"(the shortest they take is {MIN_TOKEN_LENGTH} characters).",
                    hint="Set it to a random token, for example the output of "
                    "python -c 'import secrets; print(secrets.token_urlsafe(32))'.",
                    id="pgoutbox.W003",
                )
            )
    return messages
