from django.apps import AppConfig


class TestJobsConfig(AppConfig):
    name = "testproject.testjobs"
    label = "testjobs"
    default_auto_field = "django.db.models.BigAutoField"
