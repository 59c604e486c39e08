from django.db import models


class SideEffect(models.Model):
    """One row per thing a test handler did: the checker of at-least-once execution."""

    job_id = models.UUIDField(db_index=True)
    attempt = models.IntegerField()
    event = models.TextField()  # "start" or "end"
    pid = models.IntegerField()
    worker_thread = models.TextField()
    at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.job_id} #{self.attempt} {self.event}"


class Projection(models.Model):
    """One row per event a test subscriber projected, written in the relay's transaction."""

    event_id = models.UUIDField(unique=True)
    aggregate_id = models.UUIDField()
    sequence = models.IntegerField()
    relay = models.TextField()

    def __str__(self) -> str:
        return f"{self.aggregate_id} #{self.sequence}"
