"""Views for monitoring: ``metrics`` (Prometheus) and ``health`` (liveness of the workers).

Include them under a path of your choice, and protect them as you protect other internal
endpoints (they reveal queue names and counts, never payloads or organization ids)::

    urlpatterns = [path("pgoutbox/", include("django_pgoutbox.urls"))]
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from django_pgoutbox.health import DEFAULT_MAX_AGE, health_report


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    try:
        from django_pgoutbox.prometheus import CONTENT_TYPE, database_exposition
    except ImportError as error:
        return HttpResponse(str(error), status=501, content_type="text/plain")
    return HttpResponse(database_exposition(), content_type=CONTENT_TYPE)


@require_GET
def health(request: HttpRequest) -> JsonResponse:
    """200 when every required role was seen recently, 503 otherwise.

    ``?require=jobs,relay`` narrows the roles; ``?max_age=30`` sets the staleness limit;
    ``?database=alias`` reads the workers of another database (default: the router's choice).
    """
    require = [r for r in request.GET.get("require", "jobs,relay,scheduler").split(",") if r]
    try:
        max_age = float(request.GET.get("max_age", DEFAULT_MAX_AGE))
    except ValueError:
        return JsonResponse({"error": "max_age must be a number of seconds"}, status=400)
    database = request.GET.get("database") or None
    if database is not None and database not in settings.DATABASES:
        return JsonResponse({"error": f"no database {database!r} in DATABASES"}, status=400)
    report = health_report(max_age=max_age, require=require, using=database)
    return JsonResponse(report.as_dict(), status=200 if report.healthy else 503)
