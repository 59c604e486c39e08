import os

from django.apps import AppConfig


class TestJobsConfig(AppConfig):
    name = "testproject.testjobs"
    label = "testjobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Only then: the project runs without OpenTelemetry installed too.
        if os.environ.get("PGOUTBOX_TEST_TRACES"):
            from testproject.testjobs import traces

            traces.configure()
