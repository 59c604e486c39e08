"""The Django admin: dead letters one click from a fix, and every queue at a glance.

- Dead letters (jobs): filters by queue, job type and error code; search by id or idempotency
  key; pretty-printed payload; actions retry now, cancel and delete, each confirmed and logged.
  A page of their causes (``admin/pgoutbox/deadletter/causes/``): grouped by job type, error code
  and normalised summary, with a retry and a cancel of a whole cause (``causes``).
- Jobs: every job, with an action that cancels them (running ones are asked to stop), filtered
  by status, queue and job type; the built-in maintenance jobs hidden unless asked for.
- Detail pages: the row's fields grouped, its times in order, its error whole; buttons that run
  a page's action on that one row (``<id>/<button>/``, POST only); a publisher's job and its
  event linked both ways.
- Workflows: newest first, each with its steps' states (one statement for the page); a
  workflow's page draws its steps as a graph (SVG, laid out on the server: ``graph``), lists
  them, and has a confirmed cancel of the workflow and retry of a dead step (``workflows``); a
  job's page links its workflow, its parents and its children.
- Jobs, outbox events (with re-drive and discard for dead events, and each event's deliveries on
  its page), outbox deliveries (with re-drive and discard for dead ones), schedules (with "run
  now"), inbox messages (filtered by source, searched by message id): read-only changelists.
- An overview page (``admin/pgoutbox/job/overview/``): per queue, paused or running with the
  values in effect and the forms that pause, resume and resize it (``queues``), charts of the
  last hours (``charts``), counts by state, oldest due age
  and a link to its dead letters; outbox lag; who holds the xmin horizon (with its last query:
  the page is for those who may view jobs); schedules due.

Every page is bounded by what it reads, whatever its query string says:

- Changelists never count a big table: the paginator uses the planner's estimate, and the default
  orderings follow an index (``id`` is a time-ordered UUIDv7, so "newest first" is a backward scan
  of the primary key). Columns sort only where an index or a small set makes it cheap; facet
  counts are off. Payloads and results are read on detail pages only, at most ``PREVIEW_CHARS``
  of each.
- Filters offer names the app knows (configured queues, registered job types, subscribers' event
  types, a bounded sample of the newest dead letters), never ``SELECT DISTINCT`` over the rows.
  The query string takes these filters and nothing else: any other lookup is a 400.
- Bulk actions act on every selected row, ``CHUNK`` ids per statement, each chunk locked, checked
  and logged in a transaction of its own; a row that changed since the confirmation page is left
  alone and counted in the message. "Select all" acts on the rows that matched the filters when
  the confirmation page was shown, and only with the signed confirmation of that page.
- Nothing unfinished is deleted: jobs once finished, events once processed, cursors once their
  schedule is gone. Detail pages are read-only: a save would write back a copy that a worker may
  have changed since.
"""

from __future__ import annotations

from django_pgoutbox.admin.common import EstimatedCountPaginator
from django_pgoutbox.admin.deliveries import OutboxDeliveryAdmin
from django_pgoutbox.admin.events import OutboxEventAdmin, ScheduleAdmin
from django_pgoutbox.admin.inbox import InboxMessageAdmin
from django_pgoutbox.admin.jobs import DeadLetterAdmin, JobAdmin
from django_pgoutbox.admin.workflows import WorkflowAdmin

__all__ = [
    "DeadLetterAdmin",
    "EstimatedCountPaginator",
    "InboxMessageAdmin",
    "JobAdmin",
    "OutboxDeliveryAdmin",
    "OutboxEventAdmin",
    "ScheduleAdmin",
    "WorkflowAdmin",
]
