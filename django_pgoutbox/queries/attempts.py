"""The attempt log: the entry that the end of an attempt appends to ``jobs.attempt_log``.

An attempt that completes its job is never logged: the row's own columns are that attempt
(``locked_by``, ``locked_at``, ``completed_at``; no outcome write clears them), and the most
jobs complete at their first attempt, so the hot path writes nothing more. Every other end of an
attempt appends one entry (RECORD_OUTCOMES: a failure, a snooze, a timeout, dead, cancelled;
RECOVER_EXPIRED_LEASES: lost; RELEASE_JOBS: released at shutdown); ``models.Job.attempt_history``
reads them back, followed by the row's own attempt. UNCLAIM_JOBS logs nothing: its attempt never
began, and its number is claimed again.
"""

from __future__ import annotations

#: ``attempt_log`` keeps the newest this many entries; the oldest goes as one more comes.
MAX_LOGGED_ATTEMPTS = 20

#: An entry's ``summary`` never holds more than this many characters (the row's
#: ``last_error_summary`` holds up to twice as many: the log keeps twenty of them).
MAX_LOGGED_SUMMARY = 500


def append_attempt(*, row: str, outcome: str, code: str, summary: str) -> str:
    """The SQL expression of ``attempt_log`` with the entry of the attempt ``row`` holds (its
    alias and a dot, or nothing) appended, the oldest dropped past ``MAX_LOGGED_ATTEMPTS``.

    ``outcome``, ``code`` and ``summary`` are SQL expressions of text; a summary longer than
    ``MAX_LOGGED_SUMMARY`` is cut, ending in ``...``. The attempt's number,
    worker and start are the row's as the attempt ran (a SET reads the old row), its end is
    ``now()``. A log that is not an array (written by hand) starts over rather than fail the
    write: an outcome must always be writable.
    """
    log = f"{row}attempt_log"
    kept = f"""CASE WHEN jsonb_typeof({log}) = 'array'
                    THEN CASE WHEN jsonb_array_length({log}) >= {MAX_LOGGED_ATTEMPTS}
                              THEN {log} - 0 ELSE {log} END END"""
    return f"""coalesce({kept}, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
        'attempt', {row}attempts,
        'worker', {row}locked_by,
        'started_at', {row}locked_at,
        'ended_at', now(),
        'outcome', {outcome},
        'error_code', {code},
        'summary', CASE WHEN length({summary}) > {MAX_LOGGED_SUMMARY}
                        THEN left({summary}, {MAX_LOGGED_SUMMARY - 3}) || '...'
                        ELSE {summary} END))"""
