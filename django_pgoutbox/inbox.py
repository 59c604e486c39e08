"""The inbox: ``accept_message()``, which tells a message received from another system (a
webhook's delivery) from its redeliveries, in the transaction that handles it."""

from __future__ import annotations

import warnings
from typing import Any

from django.db import connections

from django_pgoutbox import queries
from django_pgoutbox.db import tables_required, write_database
from django_pgoutbox.errors import InboxAutocommitWarning, InboxError
from django_pgoutbox.models import InboxMessage
from django_pgoutbox.validation import MAX_MESSAGE_ID_BYTES, MAX_NAME_BYTES, non_empty_text


def accept_message(source: str, message_id: str, *, using: str | None = None) -> bool:
    """Record message ``message_id`` of ``source`` in the caller's transaction: True the first
    time, False for a duplicate (a message recorded by a committed transaction, and kept for
    ``PGOUTBOX["RETENTION"]["INBOX_MESSAGES"]``).

    Call it inside ``transaction.atomic()`` with the work the message asks for (``publish()``,
    ``enqueue()``, your own writes), and do that work only when it returns True: the record
    commits with the work or not at all, so a delivery that fails is accepted again when the
    sender retries it. Of concurrent deliveries of one message, one gets True; the others wait
    for its transaction and get False once it commits, or the first of them True if it rolls
    back. Outside a transaction (autocommit) the record commits at once, and an
    ``InboxAutocommitWarning`` says so. One statement.
    """
    source = non_empty_text(source, "source", InboxError, MAX_NAME_BYTES)
    message_id = non_empty_text(message_id, "message_id", InboxError, MAX_MESSAGE_ID_BYTES)
    alias = write_database(using, InboxMessage, InboxError)
    connection = connections[alias]
    if connection.get_autocommit():
        warnings.warn(
            f"accept_message({source!r}, ...) outside a transaction on database {alias!r}: the "
            "message is recorded and committed at once, so a failure to handle it afterwards "
            "loses it (the sender's redelivery is a duplicate). Call it inside "
            "transaction.atomic() with the work the message asks for.",
            InboxAutocommitWarning,
            stacklevel=2,
        )
    with tables_required(alias, InboxError, added_later=True), connection.cursor() as cursor:
        cursor.execute(queries.ACCEPT_MESSAGE, {"source": source, "message_id": message_id})
        row: Any = cursor.fetchone()
    return row is not None
