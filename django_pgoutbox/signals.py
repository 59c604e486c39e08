"""Django signals around each job attempt, for a project's own telemetry.

``job_started(sender=JobDefinition | None, job=ClaimedJob)`` is sent in the worker thread just
before the handler runs; ``job_finished(sender=..., job=ClaimedJob, outcome=str, duration=float)``
just after, with the outcome the attempt will record (``completed``, ``retrying``, ``dead`` or
``cancelled``) and the handler's run time in seconds. Receivers must not raise: an exception in
one is logged and ignored (``send_robust``), so telemetry can never fail a job.
"""

from django.dispatch import Signal

job_started = Signal()
job_finished = Signal()
