"""Priority aging's pass (``aging.age_priorities``) against PostgreSQL: what it raises and what
it leaves, idempotent whatever runs it how often, cut short, at the int4 limits, and the plans
of the pass and of the claim of an aging queue."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
import pytest
from django.db import connection

from django_pgoutbox import enqueue_many, queries
from django_pgoutbox.aging import PASSES_PER_STEP, age_priorities
from django_pgoutbox.conf import MAX_INT32, PriorityAging
from django_pgoutbox.models import Job

pytestmark = pytest.mark.django_db

STEP = 60.0
AGING = PriorityAging(every=STEP, up_to=10)


def jobs(*shapes: tuple[int, float], queue: str = "default") -> list[uuid.UUID]:
    """Jobs of ``queue``, each ``(priority, steps waited)``: due that many steps ago (by the
    database clock, which stands still in the test's transaction)."""
    rows = enqueue_many(
        [
            {"job_type": "tests.noop", "payload": {"n": n}, "queue": queue}
            for n in range(len(shapes))
        ]
    )
    ids = [row.id for row in rows]
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE jobs SET priority = s.priority, run_at = now() - make_interval(secs => s.wait) "
            "FROM unnest(%s::uuid[], %s::integer[], %s::float8[]) AS s(id, priority, wait) "
            "WHERE jobs.id = s.id",
            [ids, [p for p, _ in shapes], [steps * STEP for _, steps in shapes]],
        )
    return ids


def priorities(ids: list[uuid.UUID]) -> list[tuple[int, int | None]]:
    found = dict(Job.objects.filter(id__in=ids).values_list("id", "priority"))
    bases = dict(Job.objects.filter(id__in=ids).values_list("id", "base_priority"))
    return [(found[i], bases[i]) for i in ids]


def age(aging: PriorityAging = AGING, **options: Any) -> int:
    return age_priorities("default", aging, spaced=False, **options)


def test_a_job_gains_one_priority_per_step_waited_up_to_the_cap() -> None:
    ids = jobs((0, 0.5), (0, 1.0), (0, 3.5), (0, 1000), (-5, 2), (9, 1))
    assert age() == 5
    assert priorities(ids) == [(0, None), (1, 0), (3, 0), (10, 0), (-3, -5), (10, 9)]


def test_a_pass_again_raises_nothing_more() -> None:
    ids = jobs((0, 2.5), (3, 4), (0, 0.2))
    assert age() == 2
    before = priorities(ids)
    assert age() == 0  # the wait earns a raise, not the passes
    assert priorities(ids) == before == [(2, 0), (7, 3), (0, None)]


def test_the_raise_follows_the_base_not_the_priority_raised() -> None:
    """A job raised once is raised again by its wait from its first priority: base 0, four
    steps waited, is 4, whether it was raised to 2 meanwhile or not."""
    ids = jobs((0, 4))
    Job.objects.filter(id=ids[0]).update(priority=2, base_priority=0)
    assert age() == 1
    assert priorities(ids) == [(4, 0)]


def test_a_job_at_or_above_the_cap_and_a_raised_one_are_never_lowered() -> None:
    ids = jobs((20, 50), (10, 50), (0, 1))
    Job.objects.filter(id=ids[2]).update(priority=7, base_priority=0)  # raised by a longer step
    assert age() == 0
    assert priorities(ids) == [(20, None), (10, None), (7, 0)]


def test_only_the_due_waiting_jobs_of_the_queue() -> None:
    ids = jobs((0, 5), (0, 5), (0, 5), (0, 5), (0, 5), (0, 5))
    other = jobs((0, 5), queue="reports")
    statuses = ["pending", "retrying", "leased", "dead", "completed", "waiting"]
    for job_id, status in zip(ids, statuses, strict=True):
        Job.objects.filter(id=job_id).update(status=status)
    future = jobs((0, -3))  # due in three steps
    assert age() == 2
    assert [p for p, _ in priorities(ids)] == [5, 5, 0, 0, 0, 0]
    assert priorities(other + future) == [(0, None), (0, None)]


def test_a_retried_job_keeps_its_raise_and_ages_from_its_new_run_at() -> None:
    ids = jobs((0, 3))
    assert age() == 1
    with connection.cursor() as cursor:  # failed, retried: due again now
        cursor.execute("UPDATE jobs SET status = 'retrying', run_at = now() WHERE id = %s", ids)
    assert age() == 0
    assert priorities(ids) == [(3, 0)]


def test_int4_limits() -> None:
    lowest, highest = -MAX_INT32 - 1, MAX_INT32
    ids = jobs((lowest, 5), (lowest, 10**8), (highest, 10**8), (highest - 1, 10**8))
    assert age(PriorityAging(every=1.0, up_to=highest)) == 3
    assert priorities(ids) == [
        (lowest + 5 * 60, lowest),
        (highest, lowest),  # 6e9 steps past the lowest: the cap, no overflow
        (highest, None),
        (highest, highest - 1),
    ]
    ids = jobs((0, 10**7))
    assert age(PriorityAging(every=1.0, up_to=lowest)) == 0  # a cap below every priority
    assert priorities(ids) == [(0, None)]


def test_an_infinite_run_at_written_by_hand_is_left_alone() -> None:
    ids = jobs((0, 0), (0, 0))
    with connection.cursor() as cursor:
        cursor.execute("UPDATE jobs SET run_at = '-infinity' WHERE id = %s", [ids[0]])
        cursor.execute("UPDATE jobs SET run_at = 'infinity' WHERE id = %s", [ids[1]])
    assert age() == 0
    assert priorities(ids) == [(0, None), (0, None)]


def test_in_batches_each_job_once_and_a_pass_cut_short_goes_on_at_the_next() -> None:
    shapes = [(p, steps) for p in (0, 2, 5) for steps in (1, 2.5, 7, 0.1)]
    ids = jobs(*shapes)
    expected = [(min(10, p + int(steps)), p if steps >= 1 else None) for p, steps in shapes]
    assert age(batch=2, budget=0.0) == 2  # one batch, then past its budget
    assert age(batch=2) == 7  # the rest, each once
    assert priorities(ids) == [(p, b if p != b else None) for p, b in expected]
    assert age(batch=1) == 0


def test_a_pass_is_spaced_across_callers() -> None:
    ids = jobs((0, 2))
    assert age_priorities("default", AGING) == 1
    Job.objects.filter(id=ids[0]).update(priority=0, base_priority=None)
    # a pass started on the queue less than a quarter of a step ago: none now
    assert age_priorities("default", AGING) == 0
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE queue_aging SET aged_at = now() - make_interval(secs => %s)",
            [STEP / PASSES_PER_STEP],
        )
    assert age_priorities("default", AGING) == 1
    with connection.cursor() as cursor:  # a clock set back: the row is in the future
        cursor.execute("UPDATE queue_aging SET aged_at = now() + interval '1 day'")
    Job.objects.filter(id=ids[0]).update(priority=0, base_priority=None)
    assert age_priorities("default", AGING) == 1


def plan(sql: str, params: Any) -> str:
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs")
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_the_pass_reads_the_claim_index() -> None:
    jobs(*[(n % 4, n % 9) for n in range(3000)])
    shown = plan(
        queries.AGE_PRIORITIES,
        {
            "queue": "default",
            "every": STEP,
            "up_to": 10,
            "limit": 10,
            "after_priority": 3,
            "after_run_at": "2026-01-01",
            "after_created_at": "2026-01-01",
            "after_id": uuid.uuid4(),
            "channel": "pgoutbox_jobs",
            "notify": True,
        },
    )
    assert shown.count("jobs_claim_idx") == 2, shown
    # read in the index's order: no sort of what remains at each batch
    assert "Seq Scan on jobs" not in shown, shown
    assert "Sort" not in shown.split("CTE raised")[0], shown


def test_the_claim_of_an_aging_queue_is_still_an_index_scan_in_order() -> None:
    """The claim is unchanged by aging: raised jobs are rows of the index at their new
    priority, read in order, with no sort of the candidates."""
    jobs(*[(n % 4, n % 9) for n in range(300)])
    assert age() > 0
    claim = {"queue": "default", "limit": 10, "worker_id": "w", "lease": 60.0}
    full = plan(queries.CLAIM_JOBS, claim)
    mark = {
        "mark_priority": 3,
        "mark_run_at": "2026-01-01",
        "mark_created_at": "2026-01-01",
        "mark_id": uuid.uuid4(),
    }
    seek = plan(queries.SEEK_CLAIM_JOBS, {**claim, **mark})
    for shown, scans in ((full, 1), (seek, 2)):
        candidates = shown.split("CTE candidates")[1].split("CTE claimed")[0]
        assert candidates.count("jobs_claim_idx") == scans, shown
        assert "Sort" not in candidates, shown
        assert "Seq Scan on jobs" not in shown, shown


@pytest.mark.django_db(transaction=True)  # two connections must see the jobs committed
def test_passes_at_once_on_two_connections_raise_each_job_once(
    raw_connection_params: dict[str, Any],
) -> None:
    ids = jobs(*[(n % 3, 1 + n % 5) for n in range(400)])
    expected = {
        i: min(10, p + int(s))
        for i, (p, s) in zip(ids, [(n % 3, 1 + n % 5) for n in range(400)], strict=True)
    }
    raised: list[int] = []
    start = threading.Barrier(2)

    def run() -> None:
        with psycopg.connect(**raw_connection_params, autocommit=True) as conn:
            start.wait()
            raised.append(age_priorities("default", AGING, connection=conn, spaced=False, batch=7))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # a job read by both (one skipped it locked, or found it raised already) is raised once
    assert sum(raised) == len(ids)
    assert {i: p for i, (p, _) in zip(ids, priorities(ids), strict=True)} == expected


def test_the_admin_shows_the_priority_before_aging(admin_client: Any) -> None:
    raised, plain = jobs((0, 3), (0, 0.5))
    assert age() == 1
    page = admin_client.get(f"/admin/pgoutbox/job/{raised}/change/").content.decode()
    assert "Priority before aging" in page
    assert "0 (raised to 3 by priority aging)" in page
    page = admin_client.get(f"/admin/pgoutbox/job/{plain}/change/").content.decode()
    assert "not raised by priority aging" in page


@pytest.mark.django_db(transaction=True)  # the lane's connection must see the job committed
def test_a_pass_that_fails_is_logged_and_the_recovery_still_answers(
    lane_conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A pass that fails (here: a step of 0, which no setting allows, divides by zero) leaves
    the lease recovery it runs with answered, and the lane's connection usable."""
    from django_pgoutbox.worker.leases import Recover

    jobs((0, 2))
    recover = Recover("default", aging=PriorityAging(every=0.0, up_to=5))
    recover.run(lane_conn)
    assert recover.raised == 0
    assert "priority aging failed" in caplog.text
    recover = Recover("default", aging=AGING)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM queue_aging")
    recover.run(lane_conn)
    assert recover.raised == 1


@pytest.mark.django_db(transaction=True)
def test_a_pass_that_raises_jobs_wakes_the_queues_workers(listener: Any) -> None:
    """The raised jobs sort before every worker's seek mark: the wake-up makes each take a full
    claim, not only the worker that ran the pass."""
    from tests.conftest import drain_notifications

    jobs((0, 5))
    drain_notifications(listener, timeout=0.1)
    assert age_priorities("default", AGING, spaced=False) == 1
    assert "default" in drain_notifications(listener)
    assert age_priorities("default", AGING, spaced=False) == 0  # nothing raised: no wake-up
    assert drain_notifications(listener) == []
