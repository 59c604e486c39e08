"""Dead letters by cause: the normaliser (the SQL functions of migration 0012), the groups, the
admin's page and its retry and cancel of a whole cause, the command."""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from django_pgoutbox import JobContext, control
from django_pgoutbox.admin.common import breadcrumbs_as_list
from django_pgoutbox.errors import InvalidInput
from django_pgoutbox.models import Job, JobStatus

pytestmark = pytest.mark.django_db

CAUSES = "/admin/pgoutbox/deadletter/causes/"
DEAD = "/admin/pgoutbox/deadletter/"


def pattern(summary: str | None) -> str | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pgoutbox_error_pattern(%s)", [summary])
        value: str | None = cursor.fetchone()[0]
    return value


def fingerprint(job_type: str, code: str | None, summary: str | None) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pgoutbox_error_fingerprint(%s, %s, %s)", [job_type, code, summary])
        value: str = cursor.fetchone()[0]
    return value


def dead(
    summary: str,
    *,
    job_type: str = "tests.behave",
    code: str = "PermanentError",
    queue: str = "default",
    ago: float = 30,
) -> Job:
    """A dead job, as a worker leaves one, ``ago`` seconds dead (before the test's transaction
    began: the moment a confirmation counts at is its `now()`)."""
    return Job.objects.create(
        queue=queue,
        job_type=job_type,
        payload={},
        status=JobStatus.DEAD,
        attempts=3,
        last_error_code=code,
        last_error_summary=summary,
        finished_at=timezone.now() - timedelta(seconds=ago),
    )


def retrying(summary: str, *, code: str = "PermanentError") -> Job:
    """A job that failed and will be retried: not dead."""
    return Job.objects.create(
        queue="default",
        job_type="tests.behave",
        payload={},
        status=JobStatus.RETRYING,
        last_error_code=code,
        last_error_summary=summary,
    )


def leased(**fields: Any) -> Job:
    """A job running its last attempt, held by worker ``w`` unless ``fields`` say otherwise."""
    return Job.objects.create(
        **{
            "queue": "default",
            "job_type": "tests.behave",
            "payload": {},
            "status": JobStatus.LEASED,
            "attempts": 3,
            "max_attempts": 3,
            "locked_by": "w",
            **fields,
        }
    )


class TestNormaliser:
    @pytest.mark.parametrize(
        ("summary", "expected"),
        [
            ("Order 42 not found", "Order <n> not found"),
            ("took 3.25s, 1,000 rows", "took <n>s, <n> rows"),
            ("at 10.0.0.1:5432", "at <n>:<n>"),
            ("job 01a2290f-03dc-760b-b6d2-d2809659b8bd gone", "job <uuid> gone"),
            ("JOB 01A2290F-03DC-760B-B6D2-D2809659B8BD gone", "JOB <uuid> gone"),
            ("mail to bob.smith+x@mail.example.co.uk bounced", "mail to <email> bounced"),
            ("KeyError: 'account_id'", "KeyError: '…'"),
            ('relation "orders" does not exist', 'relation "…" does not exist'),
            ("can't decode byte 0xff in position 12", "can't decode byte <id> in position <n>"),
            ("object at 0x7f3a2c1d9e80>", "object at <id>>"),
            ("commit deadbeef12 failed", "commit <id> failed"),
            ("charge ch_3MmlLrLkdIwHu7ix0snN0B15 declined", "charge ch_<id> declined"),
            ("  a \t b\n\n c  ", "a b c"),
            (
                "Fehler: Bestellung 7 \u2013 Kunde «Müller» 🙂",
                "Fehler: Bestellung <n> \u2013 Kunde «Müller» 🙂",
            ),
            ("", ""),
        ],
    )
    def test_rules(self, summary: str, expected: str) -> None:
        assert pattern(summary) == expected

    @pytest.mark.parametrize(
        ("one", "other"),
        [
            # Two causes that normalise to one: the value that tells them apart is quoted, a
            # number, or past the first 500 characters.
            ("KeyError: 'account_id'", "KeyError: 'owner'"),
            ('relation "orders" does not exist', 'relation "users" does not exist'),
            ("HTTP 404 from partner", "HTTP 503 from partner"),
            ("x" * 500 + " first", "x" * 500 + " second"),
        ],
    )
    def test_traps_two_causes_in_one(self, one: str, other: str) -> None:
        assert fingerprint("t", "E", one) == fingerprint("t", "E", other)

    @pytest.mark.parametrize(
        ("one", "other"),
        [
            # One cause split in two: what the rules keep differs.
            ("customer «Müller» refused", "customer «Smith» refused"),  # not a quote they know
            ("balance -5", "balance 5"),  # the sign is kept
            ("Timeout", "timeout"),  # case is kept
            ("token abcdefabcdefabcdef", "token fedcbafedcbafedcba"),  # no digit: not an id
            ("order 12345678", "order deadbeef"),  # all digits: a number, not an id
            ("for 'O'Brien street 5'", "for 'Main street 5'"),  # a quote inside a quote
        ],
    )
    def test_traps_one_cause_in_two(self, one: str, other: str) -> None:
        assert fingerprint("t", "E", one) != fingerprint("t", "E", other)

    def test_fingerprint_parts(self) -> None:
        base = fingerprint("reports.build", "MemoryError", "MemoryError")
        assert len(base) == 16
        assert int(base, 16) >= 0
        assert fingerprint("reports.build", "MemoryError", "MemoryError 2") != base
        assert fingerprint("reports.buil", "dMemoryError", "MemoryError") != base
        assert fingerprint("reports.build", "Other", "MemoryError") != base
        assert fingerprint("reports.build", None, None) == fingerprint("reports.build", "", "")

    def test_a_megabyte_of_odd_unicode_is_bounded(self) -> None:
        weird = "\u202e\u0301ẞ\U0001f600\u00a0\u2028" * 200_000  # 1.2 million characters
        assert len(pattern(weird) or "") <= 500
        job = dead(weird + " 12")
        found = control.dead_letter_causes()
        (cause,) = found.causes
        assert cause.example_id == job.pk
        assert len(cause.pattern) <= 500


class TestGroups:
    def test_counts_first_and_last_seen_and_the_newest_as_example(self) -> None:
        oldest = dead("Order 1 not found", ago=300)
        dead("Order 2 not found", ago=200)
        newest = dead("Order 3 not found", ago=100)
        other = dead("MemoryError", code="MemoryError", ago=50)
        dead("Order 4 not found", job_type="tests.other", ago=400)  # another job type
        retrying("Order 5 not found")  # not dead: not in any cause
        found = control.dead_letter_causes()
        assert (found.more, found.estimated) == (False, 0)
        first, *rest = found.causes
        assert (first.count, first.exact) == (3, True)
        assert (first.job_type, first.error_code) == ("tests.behave", "PermanentError")
        assert first.pattern == "Order <n> not found"
        assert first.first_seen == Job.objects.get(pk=oldest.pk).finished_at
        assert first.last_seen == Job.objects.get(pk=newest.pk).finished_at
        assert first.example_id == newest.pk
        assert sorted(cause.count for cause in rest) == [1, 1]
        assert other.pk in {cause.example_id for cause in rest}

    def test_a_big_cause_is_estimated(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for n in range(6):
            dead(f"Order {n} not found")
        dead("MemoryError", code="MemoryError")
        monkeypatch.setattr(control, "CAUSE_COUNT_CAP", 3)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE jobs")
        found = control.dead_letter_causes()
        big, small = found.causes
        assert (big.exact, small.exact, found.estimated) == (False, True, 1)
        assert 3 <= big.count <= 12  # ANALYZE read every row here: about 6
        assert control.count_dead_cause(big.fingerprint) == 6

    def test_the_estimate_leaves_out_the_jobs_retried(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Sixty died of a cause, fifty-four were retried and completed: six dead letters, which
        the estimate (the column's statistics, over every row) says, not sixty."""
        jobs = [dead(f"Order {n} not found") for n in range(60)]
        retried = [job.pk for job in jobs[6:]]
        assert control.retry_dead_jobs(retried) == 54
        Job.objects.filter(pk__in=retried).update(status=JobStatus.COMPLETED)
        cancelled = dead("Order 99 not found")
        assert control.cancel_dead_jobs([cancelled.pk]) == 1
        dead("MemoryError", code="MemoryError")
        monkeypatch.setattr(control, "CAUSE_COUNT_CAP", 3)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE jobs")
        big, _ = control.dead_letter_causes().causes
        assert not big.exact
        assert 3 <= big.count <= 12, big.count
        assert control.count_dead_cause(big.fingerprint) == 6
        assert not Job.objects.filter(pk__in=[*retried, cancelled.pk], dead_cause__isnull=False)

    def test_limit_says_there_are_more(self) -> None:
        for n in range(3):
            dead("x", code=f"E{n}")
        found = control.dead_letter_causes(limit=2)
        assert (len(found.causes), found.more) == (2, True)
        with pytest.raises(InvalidInput, match="limit"):
            control.dead_letter_causes(limit=0)

    @pytest.mark.parametrize("value", ["", "xyz", "0" * 15, "0" * 17, "A" * 16, "0\x00" * 8, 7])
    def test_a_fingerprint_is_sixteen_hex_digits(self, value: Any) -> None:
        with pytest.raises(InvalidInput, match="fingerprint"):
            control.retry_dead_cause(value)

    def test_retry_and_discard_a_cause(self) -> None:
        jobs = [dead(f"Order {n} not found", ago=10) for n in range(3)]
        keep = dead("MemoryError", code="MemoryError")
        cause = fingerprint("tests.behave", "PermanentError", "Order 1 not found")
        as_of = control.database_now()
        later = dead("Order 9 not found")  # died after the moment: left alone
        Job.objects.filter(pk=later.pk).update(finished_at=as_of + timedelta(seconds=5))
        assert control.retry_dead_cause(cause, as_of=as_of) == (3, 0)
        assert {job.status for job in Job.objects.filter(pk__in=[j.pk for j in jobs])} == {
            "pending"
        }
        assert Job.objects.get(pk=later.pk).status == JobStatus.DEAD
        assert Job.objects.get(pk=keep.pk).status == JobStatus.DEAD
        assert control.discard_dead_cause(cause, as_of=as_of + timedelta(seconds=10)) == (1, 0)
        assert Job.objects.get(pk=later.pk).status == JobStatus.CANCELLED


class TestTheCauseColumn:
    """``jobs.dead_cause``: written by each statement of the app that kills a job, cleared by
    those that retry or cancel a dead one, written by the trigger of migration 0014 for a row
    inserted dead, and by ``fill_dead_causes`` for one written dead otherwise."""

    def test_an_update_of_your_own_gets_its_cause_from_the_maintenance(self) -> None:
        from django_pgoutbox.maintenance import fill_dead_causes

        job = Job.objects.create(queue="default", job_type="tests.behave", payload={})
        assert Job.objects.get(pk=job.pk).dead_cause is None
        Job.objects.filter(pk=job.pk).update(
            status=JobStatus.DEAD,
            last_error_code="E",
            last_error_summary="Order 1 lost",
            finished_at=timezone.now(),
        )
        assert Job.objects.get(pk=job.pk).dead_cause is None  # no trigger on UPDATE
        innocent = retrying("Order 2 lost", code="E")  # failing, not dead: no cause
        assert fill_dead_causes() == 1
        assert fill_dead_causes() == 0  # nothing left to do
        first = fingerprint("tests.behave", "E", "Order 9 lost")
        assert Job.objects.get(pk=job.pk).dead_cause == first
        assert Job.objects.get(pk=innocent.pk).dead_cause is None
        # Retried, it leaves every cause; dead again of another error, it joins that one.
        control.retry_dead_jobs([job.pk])
        assert Job.objects.get(pk=job.pk).dead_cause is None
        assert [c.fingerprint for c in control.dead_letter_causes().causes] == []
        Job.objects.filter(pk=job.pk).update(
            status=JobStatus.DEAD, last_error_code="F", last_error_summary="MemoryError"
        )
        assert fill_dead_causes(limit=5) == 1
        second = fingerprint("tests.behave", "F", "MemoryError")
        assert [c.fingerprint for c in control.dead_letter_causes().causes] == [second]
        assert control.count_dead_cause(first) == 0
        control.cancel_dead_jobs([job.pk])
        assert Job.objects.get(pk=job.pk).dead_cause is None

    def test_the_recovery_job_and_command_fill_in_batches(self) -> None:
        """The lease recovery's built-in job and ``pgoutbox recover-leases`` run the fill, one
        statement after another until none is left (here two per statement)."""
        from django_pgoutbox import maintenance

        def kill(count: int) -> list[Any]:
            jobs = [retrying(f"Order {n} lost", code="E") for n in range(count)]
            Job.objects.filter(pk__in=[job.pk for job in jobs]).update(status=JobStatus.DEAD)
            return [job.pk for job in jobs]

        first = kill(5)
        assert maintenance.fill_dead_causes(limit=2) == 5
        assert set(Job.objects.filter(pk__in=first).values_list("dead_cause", flat=True)) == {
            fingerprint("tests.behave", "E", "Order 1 lost")
        }
        kill(3)
        logger = logging.LoggerAdapter(maintenance.logger, {})
        ctx = JobContext(uuid.uuid4(), "pgoutbox.recover_leases", 1, None, "q", logger)
        assert maintenance.recover_leases_job({}, ctx) == {"recovered": 0, "causes_filled": 3}
        kill(1)
        out = StringIO()
        call_command("pgoutbox", "recover-leases", stdout=out)
        assert "Gave 1 dead letter(s) their cause." in out.getvalue()
        assert not Job.objects.filter(status=JobStatus.DEAD, dead_cause=None).exists()

    def test_the_fill_reads_the_dead_letters_without_a_cause_alone(self) -> None:
        """Thousands of completed jobs and of dead letters with a cause, three without: the
        fill reads those three, not every dead letter nor the table (the planner, which takes
        "dead" and "no cause" for independent, expected hundreds without a partial index of its
        own)."""
        from django_pgoutbox.maintenance import fill_dead_causes

        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO jobs (queue, job_type, payload, status, finished_at)"
                " SELECT 'default', 'tests.behave', '{}', 'completed', now()"
                " FROM generate_series(1, 13000)"
            )
            cursor.execute(  # dead with their cause, as the app's statements kill
                "UPDATE jobs SET status = 'dead', last_error_code = 'E',"
                " last_error_summary = 'x', dead_cause = pgoutbox_error_fingerprint(job_type,"
                " 'E', 'x') WHERE id IN (SELECT id FROM jobs LIMIT 5000)"
            )
            cursor.execute(
                "UPDATE jobs SET status = 'dead', last_error_code = 'F', finished_at = now()"
                " WHERE id IN (SELECT id FROM jobs WHERE status = 'completed' LIMIT 3)"
            )
            cursor.execute("ANALYZE jobs")

            def read() -> tuple[int, int]:
                cursor.execute(
                    "SELECT seq_scan, coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables"
                    " WHERE relid = 'jobs'::regclass"
                )
                scans, fetched = cursor.fetchone()
                return int(scans), int(fetched)

            scans, fetched = read()
            assert fill_dead_causes() == 3
            assert fill_dead_causes() == 0
            scans_after, fetched_after = read()
        assert scans_after == scans
        assert fetched_after - fetched <= 12, fetched_after - fetched  # the three, twice over

    def test_a_worker_outcome_and_a_release_kill_with_a_cause(self) -> None:
        """RECORD_OUTCOMES's 'dead' (a cancellation asked meanwhile wins: no cause), and
        RELEASE_JOBS's of a job released during its last attempt."""
        from django_pgoutbox import queries

        dies, cancelled, released = leased(), leased(cancel_requested_at=timezone.now()), leased()
        with connection.cursor() as cursor:
            cursor.execute(
                queries.RECORD_OUTCOMES,
                {
                    "ids": [dies.pk, cancelled.pk],
                    "attempts": [3, 3],
                    "statuses": ["dead", "dead"],
                    "gives_back_attempt": [False, False],
                    "delays": [0.0, 0.0],
                    "codes": ["KeyError", "KeyError"],
                    "summaries": ["KeyError: 'a1'", "KeyError: 'a2'"],
                    "results": [None, None],
                    "progress": [None, None],
                    "meta": [None, None],
                    "traces": [],
                    "worker_id": "w",
                    "notify": True,
                },
            )
            cursor.execute(queries.RELEASE_JOBS, [[released.pk], [3], "w"])
        for job in (dies, cancelled, released):
            job.refresh_from_db()
        assert (dies.status, cancelled.status, released.status) == ("dead", "cancelled", "dead")
        assert dies.dead_cause == fingerprint("tests.behave", "KeyError", "KeyError: 'b'")
        assert cancelled.dead_cause is None
        assert released.dead_cause == fingerprint(
            "tests.behave", "worker_shutdown", released.last_error_summary
        )

    def test_the_lease_recovery_kills_with_a_cause(self) -> None:
        """A leased job on its last attempt whose lease expired: the recovery makes it dead."""
        from django_pgoutbox import queries

        job = leased(alone_attempt=3, locked_by="gone")  # a suspect alone: its loss counts
        Job.objects.filter(pk=job.pk).update(
            lease_expires_at=timezone.now() - timedelta(minutes=1),
            locked_at=timezone.now() - timedelta(minutes=2),
        )
        with connection.cursor() as cursor:
            cursor.execute(queries.RECOVER_EXPIRED_LEASES, {"queue": None, "notify": True})
        job.refresh_from_db()
        assert job.status == JobStatus.DEAD
        assert job.dead_cause == fingerprint(
            "tests.behave", job.last_error_code, job.last_error_summary
        )

    def test_a_row_inserted_dead_whatever_the_session_search_path(self) -> None:
        """The trigger's function is bound to the schema the migration ran in: a session that
        names the table by its schema alone still inserts dead with a cause."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_schema()")
            (schema,) = cursor.fetchone()
            cursor.execute("SET LOCAL search_path TO pg_catalog")
            cursor.execute(
                f'INSERT INTO "{schema}".jobs (queue, job_type, payload, status,'
                " last_error_code, last_error_summary) VALUES ('default', 'tests.behave', '{}',"
                " 'dead', 'E', 'x') RETURNING id"
            )
            (job_id,) = cursor.fetchone()
            cursor.execute("RESET search_path")
        assert Job.objects.get(pk=job_id).dead_cause == fingerprint("tests.behave", "E", "x")

    def test_a_cause_is_counted_from_the_index_alone(self) -> None:
        """Among dead letters of many causes (where all are of one, any index of dead letters
        reads the same rows, and the planner may take the smallest)."""
        from django_pgoutbox import queries

        for n in range(20):
            dead(f"Order {n} not found")
        Job.objects.bulk_create(
            Job(
                queue="default",
                job_type="tests.behave",
                payload={},
                status=JobStatus.DEAD,
                last_error_code=f"E{n}",
                last_error_summary="x",
                finished_at=timezone.now(),
            )
            for n in range(400)
        )
        cause = fingerprint("tests.behave", "PermanentError", "Order 1 not found")
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE jobs")
            cursor.execute(queries.DEAD_CAUSE_PLAN)
            cursor.execute(
                "EXPLAIN " + queries.COUNT_DEAD_CAUSE,
                {"fingerprint": cause, "as_of": timezone.now()},
            )
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert "Index Only Scan using jobs_dead_cause_idx" in plan, plan
        assert control.count_dead_cause(cause) == 20


@pytest.fixture
def viewer(client: Client) -> Client:
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_deadletter"))
    client.force_login(user)
    return client


class TestAdmin:
    def test_the_page_lists_the_causes_with_their_links(self, admin_client: Client) -> None:
        newest = dead("Order 7 not found")
        dead("Order 8 not found", ago=60)
        page = admin_client.get(CAUSES)
        assert page.status_code == 200
        text = page.content.decode()
        cause = fingerprint("tests.behave", "PermanentError", "x 1")
        assert f'id="cause-{cause}"' not in text  # another summary, another cause
        cause = fingerprint("tests.behave", "PermanentError", "Order 1 not found")
        assert f'id="cause-{cause}"' in text
        assert "Order &lt;n&gt; not found" in text
        assert f'href="{DEAD}{newest.pk}/change/"' in text
        assert f'href="{DEAD}?cause={cause}"' in text
        assert f'href="{CAUSES}{cause}/retry/"' in text
        assert f'href="{CAUSES}{cause}/discard/"' in text
        # The installed admin's markup: a list on Django 6, the div on 5.2.
        markup = (
            '<ol class="breadcrumbs">' if breadcrumbs_as_list() else '<div class="breadcrumbs">'
        )
        assert markup in text
        changelist = admin_client.get(DEAD).content.decode()
        assert f'href="{CAUSES}"' in changelist
        overview = admin_client.get("/admin/pgoutbox/job/overview/").content.decode()
        assert f'href="{CAUSES}"' in overview

    def test_a_dead_letters_page_links_its_cause(self, admin_client: Client) -> None:
        job = dead("Order 7 not found")
        cause = fingerprint("tests.behave", "PermanentError", "Order 1 not found")
        page = admin_client.get(f"{DEAD}{job.pk}/change/").content.decode()
        assert f'href="{DEAD}?cause={cause}"' in page
        assert f'href="{CAUSES}#cause-{cause}"' in page
        control.retry_dead_jobs([job.pk])  # no longer dead: no cause to link
        page = admin_client.get(f"/admin/pgoutbox/job/{job.pk}/change/").content.decode()
        assert "?cause=" not in page

    def test_the_changelist_filtered_to_a_cause(self, admin_client: Client) -> None:
        dead("Order 7 not found")
        dead("Order 8 not found")
        other = dead("MemoryError", code="MemoryError")
        cause = fingerprint("tests.behave", "PermanentError", "Order 1 not found")
        page = admin_client.get(f"{DEAD}?cause={cause}")
        assert page.status_code == 200
        assert page.content.count(b'name="_selected_action"') == 2
        assert str(other.pk).encode() not in page.content

    @pytest.mark.parametrize(
        "value", ["garbage", "x" * 100_000, "%00", "0%000000000000000", "ffffffffffffffff", "é"]
    )
    def test_a_hostile_cause_parameter_finds_nothing(
        self, admin_client: Client, value: str
    ) -> None:
        dead("Order 7 not found")
        page = admin_client.get(f"{DEAD}?cause={value}")
        assert page.status_code in (200, 400)
        assert page.content.count(b'name="_selected_action"') == 0

    @pytest.mark.parametrize("value", ["garbage", "f" * 17, "%00" * 16, "F" * 16, "x" * 5000])
    def test_a_hostile_fingerprint_in_the_url_is_a_400(
        self, admin_client: Client, value: str
    ) -> None:
        assert admin_client.get(f"{CAUSES}{value}/retry/").status_code == 400
        assert admin_client.post(f"{CAUSES}{value}/retry/", {"confirmed": "yes"}).status_code == 400

    def test_an_unknown_action_is_a_400(self, admin_client: Client) -> None:
        assert admin_client.get(f"{CAUSES}{'0' * 16}/delete/").status_code == 400

    def test_retry_a_cause_confirms_the_exact_count_and_leaves_changed_rows(
        self, admin_client: Client
    ) -> None:
        jobs = [dead(f"Order {n} not found", ago=60) for n in range(4)]
        other = dead("MemoryError", code="MemoryError")
        cause = fingerprint("tests.behave", "PermanentError", "Order 1 not found")
        page = admin_client.get(f"{CAUSES}{cause}/retry/")
        assert page.status_code == 200
        assert page.context["count"] == 4
        assert b"<strong>4</strong> dead letters" in page.content
        token = page.context["confirmation"]
        # Meanwhile: a colleague retries one, and one more of the cause dies.
        control.retry_dead_jobs([jobs[0].pk])
        late = dead("Order 99 not found")
        Job.objects.filter(pk=late.pk).update(finished_at=timezone.now() + timedelta(minutes=1))
        response = admin_client.post(
            f"{CAUSES}{cause}/retry/",
            {"confirmed": "yes", "confirmation": token, "select_across": "1"},
            follow=True,
        )
        assert response.redirect_chain[-1][0] == CAUSES
        message = str(next(iter(response.context["messages"])))
        assert message == (
            "Retried 3 dead letters; 1 of the 4 confirmed was no longer dead and was left as it is."
        )
        assert {Job.objects.get(pk=job.pk).status for job in jobs[1:]} == {"pending"}
        assert Job.objects.get(pk=late.pk).status == JobStatus.DEAD
        assert Job.objects.get(pk=other.pk).status == JobStatus.DEAD
        assert (
            LogEntry.objects.filter(change_message="Retry the dead letters of a cause").count() == 3
        )

    def test_discard_cancels(self, admin_client: Client) -> None:
        job = dead("Order 1 not found")
        cause = fingerprint("tests.behave", "PermanentError", "Order 1 not found")
        token = admin_client.get(f"{CAUSES}{cause}/discard/").context["confirmation"]
        admin_client.post(f"{CAUSES}{cause}/discard/", {"confirmed": "yes", "confirmation": token})
        assert Job.objects.get(pk=job.pk).status == JobStatus.CANCELLED

    def test_a_confirmation_for_another_cause_or_action_is_refused(
        self, admin_client: Client
    ) -> None:
        job = dead("Order 1 not found")
        dead("MemoryError", code="MemoryError")
        cause = fingerprint("tests.behave", "PermanentError", "Order 1 not found")
        other = fingerprint("tests.behave", "MemoryError", "MemoryError")
        token = admin_client.get(f"{CAUSES}{other}/retry/").context["confirmation"]
        for url in (f"{CAUSES}{cause}/retry/", f"{CAUSES}{other}/discard/"):
            response = admin_client.post(
                url, {"confirmed": "yes", "confirmation": token}, follow=True
            )
            assert "does not match its page" in str(next(iter(response.context["messages"])))
        admin_client.post(f"{CAUSES}{cause}/retry/", {"confirmed": "yes", "confirmation": "x"})
        assert Job.objects.get(pk=job.pk).status == JobStatus.DEAD

    def test_a_cause_with_nothing_left_says_so(self, admin_client: Client) -> None:
        response = admin_client.get(f"{CAUSES}{'0' * 16}/retry/", follow=True)
        assert "nothing was done" in str(next(iter(response.context["messages"])))

    def test_view_only_sees_the_page_but_cannot_act(self, viewer: Client) -> None:
        job = dead("Order 1 not found")
        cause = fingerprint("tests.behave", "PermanentError", "Order 1 not found")
        page = viewer.get(CAUSES)
        assert page.status_code == 200
        assert b"Retry all" not in page.content
        assert viewer.get(f"{CAUSES}{cause}/retry/").status_code == 403
        assert viewer.post(f"{CAUSES}{cause}/retry/", {"confirmed": "yes"}).status_code == 403
        assert Job.objects.get(pk=job.pk).status == JobStatus.DEAD

    def test_without_view_permission_403(self, client: Client) -> None:
        user = User.objects.create_user("nobody", password="pw", is_staff=True)
        client.force_login(user)
        assert client.get(CAUSES).status_code == 403


class TestCommand:
    def test_causes_lists_the_groups(self) -> None:
        dead("Order 1 not found")
        dead("Order 2 not found")
        dead("MemoryError", code="MemoryError")
        out = StringIO()
        call_command("pgoutbox", "deadletters", "causes", stdout=out)
        header, first, second = out.getvalue().splitlines()
        assert header.startswith("cause")
        cause = fingerprint("tests.behave", "PermanentError", "Order 1 not found")
        assert first.startswith(cause)
        assert "Order <n> not found" in first
        assert "MemoryError" in second

    def test_causes_says_when_there_is_nothing(self) -> None:
        out = StringIO()
        call_command("pgoutbox", "deadletters", "causes", stdout=out)
        assert out.getvalue() == "No dead jobs.\n"

    def test_list_retry_and_discard_by_cause(self) -> None:
        jobs = [dead(f"Order {n} not found") for n in range(2)]
        other = dead("MemoryError", code="MemoryError")
        cause = fingerprint("tests.behave", "PermanentError", "Order 1 not found")
        out = StringIO()
        call_command("pgoutbox", "deadletters", "list", "--cause", cause, stdout=out)
        assert str(jobs[0].pk) in out.getvalue()
        assert str(other.pk) not in out.getvalue()
        out = StringIO()
        call_command("pgoutbox", "deadletters", "retry", "--cause", cause, "--yes", stdout=out)
        assert out.getvalue() == "Retried 2 dead job(s).\n"
        assert Job.objects.get(pk=other.pk).status == JobStatus.DEAD
        out = StringIO()
        call_command("pgoutbox", "deadletters", "discard", "--cause", cause, "--yes", stdout=out)
        assert out.getvalue() == "No dead jobs of this cause.\n"
        other_cause = fingerprint("tests.behave", "MemoryError", "MemoryError")
        call_command("pgoutbox", "deadletters", "discard", "--cause", other_cause, "--yes")
        assert Job.objects.get(pk=other.pk).status == JobStatus.CANCELLED

    def test_says_how_many_of_those_counted_were_left_alone(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        jobs = [dead(f"Order {n} not found") for n in range(3)]
        cause = fingerprint("tests.behave", "PermanentError", "Order 1 not found")
        counted = control.count_dead_cause

        def count_then_a_colleague_retries_one(*args: Any, **kwargs: Any) -> int:
            number = counted(*args, **kwargs)
            control.retry_dead_jobs([jobs[0].pk])
            return number

        monkeypatch.setattr(control, "count_dead_cause", count_then_a_colleague_retries_one)
        out = StringIO()
        call_command("pgoutbox", "deadletters", "retry", "--cause", cause, "--yes", stdout=out)
        assert out.getvalue() == (
            "Retried 2 dead job(s). 1 of the 3 counted was no longer dead and was left as it is.\n"
        )

    def test_asks_first_and_refuses_without_a_terminal(self) -> None:
        job = dead("Order 1 not found")
        cause = fingerprint("tests.behave", "PermanentError", "Order 1 not found")
        with pytest.raises(CommandError, match=r"Retry 1 dead job\(s\) of cause .* --yes"):
            call_command("pgoutbox", "deadletters", "retry", "--cause", cause)
        assert Job.objects.get(pk=job.pk).status == JobStatus.DEAD

    @pytest.mark.parametrize("value", ["nope", "0" * 17, "0\x00" * 8, "g" * 16])
    def test_a_bad_fingerprint_is_a_usage_error(self, value: str) -> None:
        with pytest.raises(CommandError, match="fingerprint"):
            call_command("pgoutbox", "deadletters", "retry", "--cause", value, "--yes")

    def test_cause_with_ids_or_other_filters_is_refused(self) -> None:
        cause = "0" * 16
        with pytest.raises(CommandError, match="the cause alone"):
            call_command("pgoutbox", "deadletters", "retry", str(uuid.uuid4()), "--cause", cause)
        with pytest.raises(CommandError, match="the cause alone"):
            call_command("pgoutbox", "deadletters", "discard", "--cause", cause, "--queue", "q")
