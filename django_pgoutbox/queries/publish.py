"""Publishers: an ordered publisher's job waits for the earlier jobs of its aggregate."""

from __future__ import annotations

#: Whether an earlier job of the same ordered publisher and aggregate is not done yet (pending,
#: retrying, running, or dead: a dead one holds back the later ones until it is retried or
#: cancelled), and how long ago this job was written (seconds).
#:
#: Parameters: publisher text, aggregate text, job id uuid.
#:
#: "Earlier" is ``(created_at, id)``: the relay enqueues an aggregate's publications one event at a
#: time, each in a transaction that begins after the last one committed. One probe of
#: ``jobs_publish_order_idx``, whose predicate this statement repeats word for word.
PUBLISH_AHEAD = """
SELECT EXISTS (
           SELECT 1
           FROM jobs AS ahead
           WHERE ahead.job_type = 'pgoutbox.publish'
             AND ahead.status IN ('pending', 'retrying', 'leased', 'dead')
             AND (ahead.payload ->> 'publisher') = %s
             AND (ahead.payload ->> 'aggregate') = %s
             AND (ahead.created_at, ahead.id) < (me.created_at, me.id)
       ),
       extract(epoch FROM clock_timestamp() - me.created_at)
FROM jobs AS me
WHERE me.id = %s
"""
