"""Settings of the test and demo project."""

from __future__ import annotations

import json
import os
from typing import Any

from testproject.database import database_url, parse_database_url

SECRET_KEY = "pgoutbox-test-not-secret"
# Benchmarks and soaks set PGOUTBOX_DEBUG=0: DEBUG keeps a log of every query per connection.
DEBUG = os.environ.get("PGOUTBOX_DEBUG", "1") != "0"
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_pgoutbox",
    "testproject.demo",
    "testproject.testjobs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "testproject.urls"
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {"default": parse_database_url(database_url())}
# A second PostgreSQL database, for the tests of queues on several databases
# (runworkers --database secondary). By default a database beside the first on the same server.
DATABASES["secondary"] = (
    parse_database_url(os.environ["SECONDARY_DATABASE_URL"])
    if os.environ.get("SECONDARY_DATABASE_URL")
    else {**DATABASES["default"], "NAME": f"{DATABASES['default']['NAME']}_secondary"}
)
# The same database as "default" on a connection of its own, as a direct connection beside a
# pooled one would be (the tests of PGOUTBOX["LISTEN_DATABASES"]).
DATABASES["direct"] = {**DATABASES["default"], "TEST": {"MIRROR": "default"}}
# DATABASE_URL through a transaction-pooling proxy (PgBouncer), and this URL straight to the
# same database (tests/reliability/test_pgbouncer.py): "direct" becomes it, and "default" gets
# the setting Django asks for behind such a proxy, one of the signs of docs/databases.md.
if os.environ.get("PGOUTBOX_TEST_DIRECT_URL"):
    DATABASES["direct"] = {
        **parse_database_url(os.environ["PGOUTBOX_TEST_DIRECT_URL"]),
        "TEST": {"MIRROR": "default"},
    }
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True

# django.tasks (Django 6) or, on Django 5.2, the django-tasks backport, run by our workers.
TASKS = {"default": {"BACKEND": "django_pgoutbox.backend.PgOutboxBackend"}}
try:
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")

# The seed's seven queues, each with the concurrency its workload calls for.
PGOUTBOX: dict[str, Any] = {
    "QUEUES": {
        "default": {},
        "critical_alerts": {"CONCURRENCY": 4, "LEASE_SECONDS": 30},
        "notifications": {"CONCURRENCY": 4},
        "webhooks": {"CONCURRENCY": 4},
        "location_derivation": {"CONCURRENCY": 2},
        "reports": {"CONCURRENCY": 1, "LEASE_SECONDS": 300},
        "exports": {"CONCURRENCY": 1, "LEASE_SECONDS": 300},
        "maintenance": {"CONCURRENCY": 1},
    },
    # /pgoutbox/metrics and /pgoutbox/health: staff users, and users given the permission to
    # view jobs (a monitoring account). A Prometheus server would rather send a bearer token:
    # "BEARER_TOKEN_ENV": "PGOUTBOX_METRICS_TOKEN" (docs/observability.md).
    "VIEWS_AUTH": {"STAFF": True, "PERMISSION": "pgoutbox.view_job"},
}

# Tests start worker processes with their own lease and poll settings (seconds, not minutes).
_overrides = json.loads(os.environ.get("PGOUTBOX_TEST_SETTINGS") or "{}")
for _name, _options in _overrides.pop("QUEUES", {}).items():
    PGOUTBOX["QUEUES"][_name] = {**PGOUTBOX["QUEUES"].get(_name, {}), **_options}
PGOUTBOX.update(_overrides)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_pgoutbox": {"handlers": ["console"], "level": "WARNING"}},
}

# The shared secret of the webhook view of docs/howto/webhooks-in.md (testproject/demo/webhooks.py).
STRIPE_WEBHOOK_SECRET = "whsec_example"
