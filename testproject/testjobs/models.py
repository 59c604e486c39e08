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


class DeliveryRecord(models.Model):
    """One row per run of a subscriber of ``chaos.delivered`` (tests/processes/reliability/
    test_delivery_chaos.py) that its transaction kept: written in the relay's transaction, so
    the committed rows are the runs that took effect.

    ``id`` orders the rows by commit per aggregate and subscriber (the next event's row is written
    after the earlier one committed); ``recorded_at`` is the database's clock when it ran;
    ``committed_at``, set by a deferred constraint trigger (migration 0002), its clock when the
    transaction committed.
    """

    event_id = models.UUIDField(db_index=True)  # not unique: a duplicate run must show
    aggregate_id = models.UUIDField()
    sequence = models.IntegerField()
    subscriber = models.TextField()
    attempts = models.IntegerField()  # its delivery's attempts when it ran; 0 in the relay's batch
    pid = models.IntegerField()
    recorded_at = models.DateTimeField(db_default=models.Func(function="clock_timestamp"))
    committed_at = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"{self.subscriber} {self.aggregate_id} #{self.sequence}"
