from __future__ import annotations

from django.apps import AppConfig
from django.core import checks
from django.utils.module_loading import autodiscover_modules


class PgOutboxConfig(AppConfig):
    name = "django_pgoutbox"
    label = "pgoutbox"
    verbose_name = "Outbox and jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_pgoutbox import checks as pgoutbox_checks
        from django_pgoutbox import conf  # noqa: F401 - connects the setting_changed receiver

        checks.register(pgoutbox_checks.check_settings)
        checks.register(pgoutbox_checks.check_database_engines)
        checks.register(pgoutbox_checks.check_driver)
        checks.register(pgoutbox_checks.check_job_queues)
        checks.register(pgoutbox_checks.check_schedules)
        checks.register(pgoutbox_checks.check_pooling_proxy)
        checks.register(pgoutbox_checks.check_views_auth)
        checks.register(pgoutbox_checks.check_server_version, checks.Tags.database)
        # Handlers and subscribers live in each app's jobs.py (or subscribers.py), as admin
        # classes live in admin.py.
        from django_pgoutbox import (
            maintenance,  # noqa: F401 - registers the built-in jobs
            publishers,  # noqa: F401 - registers pgoutbox.publish
            queue_minutes,  # noqa: F401 - registers the built-in job that samples the queues
        )

        autodiscover_modules("jobs")
        autodiscover_modules("subscribers")
