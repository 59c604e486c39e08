"""A job's page: its last error, said to be a previous failure once the job completed, and
every attempt kept (``Job.attempt_history``) as a table.

Everything shown comes from the row (what handlers raised, worker ids), so every value is
escaped: the HTML is built with ``format_html`` and ``format_html_join`` only.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from django_pgoutbox.attempts import MAX_LOGGED_ATTEMPTS, AttemptRecord
from django_pgoutbox.models import Job, JobStatus

_COLUMNS = (
    "attempt",
    "worker",
    "started (UTC)",
    "ended (UTC)",
    "took",
    "outcome",
    "error code",
    "summary",
)


def last_error_and_attempts(job: Job) -> SafeString:
    """The job's last error, labelled for what it is, then the table of its attempts."""
    return format_html("{}{}", _last_error(job), _attempts(job))


def _last_error(job: Job) -> SafeString:
    if not (job.last_error_code or job.last_error_summary):
        return format_html("<p>{}</p>", "No error recorded.")
    if job.status == JobStatus.COMPLETED:
        label = "Previous failure (not the current state: a later attempt completed the job)"
    else:
        label = "Last error"
    return format_html(
        '<p><strong>{}</strong>: <code>{}</code></p><pre style="white-space: pre-wrap">{}</pre>',
        label,
        job.last_error_code or "",
        job.last_error_summary or "",
    )


def _attempts(job: Job) -> SafeString:
    history = job.attempt_history
    if not history:
        return format_html("<p>{}</p>", "No attempt kept.")
    logged = job.attempt_log if isinstance(job.attempt_log, list) else []
    note = (
        format_html(
            "<p>{}</p>",
            f"Only the newest {MAX_LOGGED_ATTEMPTS} attempts that did not complete the job are "
            "kept; older ones were dropped.",
        )
        if len(logged) >= MAX_LOGGED_ATTEMPTS
        else ""
    )
    return format_html(
        "{}<table><thead><tr>{}</tr></thead><tbody>{}</tbody></table>",
        note,
        format_html_join("", "<th>{}</th>", ((column,) for column in _COLUMNS)),
        format_html_join("", "<tr>{}</tr>", ((_row(record),) for record in history)),
    )


def _row(record: AttemptRecord) -> SafeString:
    cells = (
        "" if record.attempt is None else str(record.attempt),
        record.worker or "",
        _moment(record.started_at),
        _moment(record.ended_at),
        _took(record),
        record.outcome or "",
        record.error_code or "",
        record.summary or "",
    )
    return format_html_join("", "<td>{}</td>", ((cell,) for cell in cells))


def _moment(moment: datetime | None) -> str:
    if moment is None:
        return ""
    if timezone.is_naive(moment):  # the row's own, read in TIME_ZONE with USE_TZ = False
        moment = timezone.make_aware(moment)
    return moment.astimezone(UTC).isoformat(sep=" ", timespec="milliseconds")


def _took(record: AttemptRecord) -> str:
    if record.started_at is None or record.ended_at is None:
        return ""
    return f"{(record.ended_at - record.started_at).total_seconds():.3f} s"
