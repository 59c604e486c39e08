"""When a queue's coordinator must look again if no message comes first.

A pure function of the coordinator's parts, called by it alone (``QueueRunner._next_deadline``):
each part says its own deadlines, and this adds up which count now. A deadline whose work needs
a lane counts only while one is free: else a lane's reply wakes the coordinator.
"""

from __future__ import annotations

from django_pgoutbox.worker.claims import Claims
from django_pgoutbox.worker.controls import Controls
from django_pgoutbox.worker.lanes import Lanes
from django_pgoutbox.worker.leases import Upkeep
from django_pgoutbox.worker.state import QueueState
from django_pgoutbox.worker.suspects import Suspects

#: Past the grace period, a statement still in flight this long (seconds) is cancelled, and
#: one still unanswered this long is abandoned.
STUCK_AFTER = (1.0, 10.0)


def next_deadline(
    now: float,
    poll_interval: float,
    *,
    lane_free: bool,
    ending: bool,
    claims: Claims,
    controls: Controls,
    upkeep: Upkeep,
    progress: float | None,
    lanes: Lanes,
    state: QueueState,
    suspects: Suspects,
    lease_seconds: float,
    stop_deadline: float | None,
    loop_deadline: float | None = None,
) -> float:
    """The earliest deadline (``ending``: the queue stops, or a burst ends; ``progress``: when
    the next write of progress may go, if one is waited for; ``loop_deadline``: when the
    queue's event loop, unheard, is left behind)."""
    deadlines = [now + poll_interval]
    if lane_free:
        # Only what a turn would act on: ending, the coordinator neither polls, recovers nor
        # gathers, and those deadlines pass and stay past.
        recovering = not ending and not claims.overtaking(now)
        deadlines += upkeep.deadlines(bool(state.attempts), recovering=recovering)
        if not ending:
            deadlines += claims.deadlines()
        if progress is not None:  # the next write of running handlers' progress
            deadlines.append(progress)
    if not ending:
        # What frees a second lane, though none is free until then.
        if (overtake := claims.overtake_deadline(now)) is not None:
            deadlines.append(overtake)
        if (held_up := lanes.first_held_up_at()) is not None and now < held_up:
            deadlines.append(held_up)
        if (held := controls.hold_deadline(now)) is not None:
            deadlines.append(held)  # claims held back by a notification not yet read
    deadlines += lanes.backing_off(now)
    if loop_deadline is not None:
        deadlines.append(loop_deadline)
    deadlines += [a.deadline for a in state.timed.values() if a.deadline is not None]
    if suspects.held is not None and now < suspects.held_since + lease_seconds:
        deadlines.append(suspects.held_since + lease_seconds)
    if suspects.alone is not None:
        deadlines.append(suspects.alone_until)
    if stop_deadline is not None:
        # Once past, what holds the release back (a statement in flight, a lane backing off)
        # wakes the coordinator itself, or the end of its patience does.
        ends = [stop_deadline + after for after in (0.0, *STUCK_AFTER)]
        deadlines += [at for at in ends if at > now]
    return min(deadlines)
