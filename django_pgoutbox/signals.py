"""Django signals around each job attempt, for a project's own telemetry.

``job_started(sender=JobDefinition | NO_HANDLER, job=ClaimedJob)`` is sent in the worker thread
just before the handler runs (the sender is ``NO_HANDLER`` for a job type this worker has no
handler for); ``job_finished(sender=..., job=ClaimedJob, outcome=str, duration=float)``
just after, with the outcome the attempt will record (``completed``, ``retrying``, ``dead`` or
``cancelled``) and the handler's run time in seconds. Receivers must not raise: an exception in
one is logged and ignored (``send_robust``), so telemetry can never fail a job.
"""

from django.dispatch import Signal


class _NoHandler:
    """The sender of the signals of a job whose type has no handler in this worker."""

    def __repr__(self) -> str:
        return "NO_HANDLER"


NO_HANDLER = _NoHandler()

# use_caching: receivers are looked up once per sender (job type), not under the signal's lock
# at every attempt, which four handler threads would contend for. A cached sender must be
# weakly referenceable: hence NO_HANDLER rather than None.
job_started = Signal(use_caching=True)
job_finished = Signal(use_caching=True)
