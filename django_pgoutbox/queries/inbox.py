"""The inbox: recording a message received from another system, once."""

from __future__ import annotations

#: Record a received message in the caller's transaction, unless it is there already.
#:
#: Named parameters: source text, message_id text. Returns ``received_at`` when the message is
#: new, no row when it is a duplicate.
#:
#: One statement, which PostgreSQL makes safe under concurrency: an insert whose key another
#: transaction has inserted but not yet committed waits for it, then does nothing if it
#: committed and inserts if it rolled back. So of any number of concurrent deliveries of one
#: message, exactly one gets its row, and none gets an error (at READ COMMITTED; at REPEATABLE
#: READ and SERIALIZABLE, the waiter gets a serialization failure, to be retried, when the row it
#: waited for was committed after its snapshot). ``received_at`` is ``now()``, the database clock
#: at the start of the transaction.
ACCEPT_MESSAGE = """
INSERT INTO inbox_messages (source, message_id)
VALUES (%(source)s, %(message_id)s)
ON CONFLICT (source, message_id) DO NOTHING
RETURNING received_at
"""

#: The sources the inbox holds, in order, at most ``limit`` of them (parameters: limit int).
#:
#: A loose index scan of ``inbox_messages_uq``: one descent of the index per source, so the
#: admin's filter lists them without a ``SELECT DISTINCT`` over every message kept.
INBOX_SOURCES = """
WITH RECURSIVE sources (source) AS (
    (SELECT source FROM inbox_messages ORDER BY source LIMIT 1)
    UNION ALL
    SELECT (
        SELECT m.source FROM inbox_messages m
        WHERE m.source > sources.source
        ORDER BY m.source
        LIMIT 1
    )
    FROM sources
    WHERE sources.source IS NOT NULL
)
SELECT source FROM sources WHERE source IS NOT NULL LIMIT %s
"""
