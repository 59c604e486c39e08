"""Views for monitoring: ``metrics`` (Prometheus) and ``health`` (liveness of the workers).

Include them under a path of your choice::

    urlpatterns = [path("pgoutbox/", include("django_pgoutbox.urls"))]

Both answer only the requests that ``PGOUTBOX["VIEWS_AUTH"]`` admits (by default, active staff
users): 401 or 403 otherwise, before any parameter is read or any query runs. They reveal queue
names, counts, and (health) the host, pid and id of each worker process and the holder of the
xmin horizon: its pid, role, application, client address and the first 200 characters of its
last query, which may hold literal values of another application's data. Never a payload or an
organization id.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import os
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.module_loading import import_string
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from django_pgoutbox.checks import postgresql_databases
from django_pgoutbox.conf import MIN_TOKEN_LENGTH, ViewsAuthSettings, get_settings
from django_pgoutbox.health import (
    DEFAULT_MAX_AGE,
    ROLES,
    health_report,
    parse_max_age,
    parse_roles,
)

logger = logging.getLogger("django_pgoutbox.views")

#: The query parameters of ``health``; any other is refused.
HEALTH_PARAMETERS = ("require", "max_age", "database")


# -- who may read them ---------------------------------------------------------------------------


@functools.cache
def resolve_check(path: str) -> Callable[[HttpRequest], Any]:
    """The callable ``VIEWS_AUTH['CALLABLE']`` names; ``ImproperlyConfigured`` if there is none."""
    try:
        found = import_string(path)
    except ImportError as error:
        raise ImproperlyConfigured(
            f"PGOUTBOX['VIEWS_AUTH']['CALLABLE']: cannot import {path!r} ({error})"
        ) from error
    if not callable(found):
        raise ImproperlyConfigured(
            f"PGOUTBOX['VIEWS_AUTH']['CALLABLE']: {path!r} is a {type(found).__name__}, "
            "not a callable"
        )
    return found  # type: ignore[no-any-return]


def expected_token(rules: ViewsAuthSettings) -> bytes | None:
    """The bearer token the views accept, or None: no variable named, unset, or shorter than
    ``MIN_TOKEN_LENGTH`` (a short token would be guessed; it admits no one rather than few)."""
    if not rules.bearer_token_env:
        return None
    token = os.environ.get(rules.bearer_token_env, "")
    if len(token) < MIN_TOKEN_LENGTH:
        return None
    return token.encode("utf-8", "surrogateescape")


def _bearer(request: HttpRequest) -> bytes | None:
    """The credentials of an ``Authorization: Bearer ...`` header, as the bytes that were sent."""
    header = str(request.META.get("HTTP_AUTHORIZATION", ""))
    scheme, _, credentials = header.strip().partition(" ")
    credentials = credentials.strip()
    if scheme.lower() != "bearer" or not credentials:
        return None
    try:  # WSGI gives header bytes decoded as latin-1: this gives them back
        return credentials.encode("latin-1")
    except UnicodeEncodeError:
        return credentials.encode("utf-8", "surrogatepass")


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


def admitted(request: HttpRequest) -> bool:
    """Whether ``PGOUTBOX["VIEWS_AUTH"]`` admits ``request``: any of its rules does.

    - ``BEARER_TOKEN_ENV``: ``Authorization: Bearer <token>`` equal to that variable's value
      (compared in constant time);
    - ``STAFF``: an active staff user;
    - ``PERMISSION``: an active user holding that permission;
    - ``CALLABLE``: ``callable(request)`` returned ``True`` (``True`` itself: any other value,
      a truthy object included, admits nothing).
    """
    rules = get_settings().views_auth
    expected = expected_token(rules)
    if expected is not None:
        sent = _bearer(request)
        # Digests of equal length: the comparison takes as long whatever the token sent.
        if sent is not None and hmac.compare_digest(_digest(sent), _digest(expected)):
            return True
    user = getattr(request, "user", None)  # no AuthenticationMiddleware: no user rule applies
    if user is not None and user.is_authenticated and user.is_active:
        if rules.staff and user.is_staff:
            return True
        if rules.permission and user.has_perm(rules.permission):
            return True
    if rules.check is not None:
        check = resolve_check(rules.check) if isinstance(rules.check, str) else rules.check
        if check(request) is True:
            return True
    return False


def _refused(request: HttpRequest, *, json: bool) -> HttpResponse:
    """401 to a request that authenticated as nothing where a token would do; else 403."""
    user = getattr(request, "user", None)
    anonymous = user is None or not user.is_authenticated
    unauthenticated = anonymous and get_settings().views_auth.bearer_token_env is not None
    status = 401 if unauthenticated else 403
    message = "authentication required" if unauthenticated else "forbidden"
    response: HttpResponse
    if json:
        response = JsonResponse({"error": message}, status=status)
    else:
        response = HttpResponse(message, status=status, content_type="text/plain")
    if unauthenticated:
        response["WWW-Authenticate"] = 'Bearer realm="pgoutbox"'
    return response


# -- the views -----------------------------------------------------------------------------------


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """The database gauges and this process's counters, in Prometheus's text format."""
    if not admitted(request):
        return _refused(request, json=False)
    try:
        from django_pgoutbox.prometheus import CONTENT_TYPE, database_exposition
    except ImportError as error:
        return HttpResponse(str(error), status=501, content_type="text/plain")
    return HttpResponse(database_exposition(), content_type=CONTENT_TYPE)


def _health_parameters(request: HttpRequest) -> tuple[list[str], float, str | None]:
    """``require``, ``max_age`` and ``database`` of a health request; ``ValueError`` naming the
    parameter and what it takes, for an unknown, repeated, empty or out-of-range one."""
    try:
        names = list(request.GET)
    except SuspiciousOperation as error:  # more fields than DATA_UPLOAD_MAX_NUMBER_FIELDS
        raise ValueError(f"the query string is refused: {error}") from None
    for name in names:
        if name not in HEALTH_PARAMETERS:
            shown = name if len(name) <= 40 else f"{name[:37]}..."
            raise ValueError(
                f"unknown parameter {shown!r}; the parameters are {', '.join(HEALTH_PARAMETERS)}"
            )
        given = len(request.GET.getlist(name))
        if given > 1:
            raise ValueError(f"{name} is given {given} times; give it once")
    require = list(ROLES)
    if "require" in request.GET:
        require = parse_roles(request.GET["require"], "require")
    max_age = DEFAULT_MAX_AGE
    if "max_age" in request.GET:
        max_age = parse_max_age(request.GET["max_age"], "max_age")
    database = None
    if "database" in request.GET:
        database = request.GET["database"]
        aliases = postgresql_databases()  # the others would be a 500, or worse
        if database not in aliases:
            shown = database if len(database) <= 40 else f"{database[:37]}..."
            raise ValueError(
                f"database must be the alias of a PostgreSQL database that holds the pgoutbox "
                f"tables ({', '.join(aliases)}), not {shown!r}"
            )
    return require, max_age, database


@never_cache
@require_GET
def health(request: HttpRequest) -> HttpResponse:
    """200 when every required role was seen recently and no queue is stuck, 503 otherwise; a
    held xmin horizon is in ``horizon`` and ``warnings``, and never makes it a 503.

    ``?require=jobs,relay`` narrows the roles (default: all three; an empty list is refused);
    ``?max_age=30`` sets the staleness limit in seconds (0 < max_age <= 86400);
    ``?database=alias`` reads the workers of another database (default: the router's choice).
    Anything else, or a parameter given twice, is a 400 naming it. A database that cannot be
    read is a 503.
    """
    if not admitted(request):
        return _refused(request, json=True)
    try:
        require, max_age, database = _health_parameters(request)
    except ValueError as error:
        return JsonResponse({"error": str(error)}, status=400)
    try:
        report = health_report(max_age=max_age, require=require, using=database)
    except DatabaseError:
        logger.exception("health: reading the heartbeats failed")
        return JsonResponse(
            {"healthy": False, "error": "the heartbeats could not be read"}, status=503
        )
    return JsonResponse(report.as_dict(), status=200 if report.healthy else 503)
