"""Views for monitoring: ``metrics`` (Prometheus) and ``health`` (liveness of the workers).

Include them under a path of your choice, and protect them as you protect other internal
endpoints (they reveal queue names and counts, never payloads or organization ids)::

    urlpatterns = [path("pgoutbox/", include("django_pgoutbox.urls"))]
"""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from django_pgoutbox.checks import postgresql_databases
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


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    try:
        from django_pgoutbox.prometheus import CONTENT_TYPE, database_exposition
    except ImportError as error:
        return HttpResponse(str(error), status=501, content_type="text/plain")
    return HttpResponse(database_exposition(), content_type=CONTENT_TYPE)


def _health_parameters(request: HttpRequest) -> tuple[list[str], float, str | None]:
    """``require``, ``max_age`` and ``database`` of a health request; ``ValueError`` naming the
    parameter and what it takes, for an unknown, repeated, empty or out-of-range one."""
    for name in request.GET:
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


@require_GET
def health(request: HttpRequest) -> HttpResponse:
    """200 when every required role was seen recently and no queue is stuck, 503 otherwise.

    ``?require=jobs,relay`` narrows the roles (default: all three; an empty list is refused);
    ``?max_age=30`` sets the staleness limit in seconds (0 < max_age <= 86400);
    ``?database=alias`` reads the workers of another database (default: the router's choice).
    Anything else, or a parameter given twice, is a 400 naming it. A database that cannot be
    read is a 503.
    """
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
