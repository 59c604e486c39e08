"""Unique jobs against hostile callers and operators (docs/uniqueness.md): several dead letters
of one key retried at once, a holder written by a concurrent transaction during a retry, and an
idempotency key repeated after its job freed the unique key."""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection

from django_pgoutbox import control, enqueue, job
from django_pgoutbox.errors import JobRegistrationError
from django_pgoutbox.models import Job
from django_pgoutbox.uniqueness import Unique
from tests.integration.test_unique_jobs import claim, completed, dead, record

pytestmark = pytest.mark.django_db

TYPE = "tests.behave"


def unique(payload: dict[str, Any], **options: Any) -> Job:
    return enqueue(TYPE, payload, queue="reports", **options)


def status(found: Job) -> str:
    return str(Job.objects.get(pk=found.pk).status)


def killed(payload: dict[str, Any], **options: Any) -> Job:
    made = unique(payload, **options)
    (claimed,) = [c for c in claim() if c.id == made.pk]
    record(dead(claimed))
    return made


def holders(job: Job) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM jobs WHERE unique_key = %s"
            " AND pgoutbox_unique_state(unique_states, status)",
            [Job.objects.get(pk=job.pk).unique_key],
        )
        (count,) = cursor.fetchone()
    return int(count)


class TestDeadLettersOfOneKey:
    """A sync of account 42 that died three times: three dead letters of one key, which an
    operator retries together (selected in the admin, by cause, ``--all``)."""

    def test_retried_together_the_newest_is_retried_the_others_stay_dead(self) -> None:
        first = killed({"a": 1}, unique=True)
        second = killed({"a": 1}, unique=True)
        third = killed({"a": 1}, unique=True)
        plain = killed({"a": 2})
        assert control.retry_dead_jobs([first.pk, second.pk, third.pk, plain.pk]) == 2
        assert [status(j) for j in (first, second, third, plain)] == [
            "dead",
            "dead",
            "pending",
            "pending",
        ]
        assert holders(third) == 1

    def test_by_cause(self) -> None:
        jobs = [killed({"a": 1}, unique=True) for _ in range(3)]
        cause = Job.objects.get(pk=jobs[0].pk).dead_cause
        assert cause is not None
        assert control.retry_dead_cause(cause) == (1, 2)
        assert sorted(status(j) for j in jobs) == ["dead", "dead", "pending"]

    def test_by_the_command(self) -> None:
        jobs = [killed({"a": 1}, unique=True) for _ in range(2)]
        out = io.StringIO()
        call_command("pgoutbox", "deadletters", "retry", "--all", stdout=out)
        assert "Retried 1 dead job(s)." in out.getvalue()
        assert sorted(status(j) for j in jobs) == ["dead", "pending"]

    def test_with_dead_in_their_states_one_holds_the_key_and_is_retried(self) -> None:
        spec = Unique(states=("pending", "leased", "retrying", "dead"))
        older = killed({"a": 1}, unique=True)  # dead, not holding
        holder = killed({"a": 1}, unique=spec)  # dead, holding
        assert control.retry_dead_jobs([older.pk, holder.pk]) == 1
        assert (status(older), status(holder)) == ("dead", "pending")


@pytest.mark.django_db(transaction=True)
class TestAHolderWrittenDuringTheRetry:
    def test_the_retry_sees_it_once_it_commits_and_leaves_the_dead_letter_dead(
        self, raw_connection_params: dict[str, Any]
    ) -> None:
        dead_letter = killed({"a": 1}, unique=True)
        stored = Job.objects.get(pk=dead_letter.pk)
        other = psycopg.connect(**raw_connection_params)
        try:
            other.execute("SET lock_timeout = '10s'")
            # another transaction enqueues the key (as enqueue() writes it) and commits later
            other.execute(
                "INSERT INTO jobs (id, queue, job_type, payload, priority, run_at, max_attempts,"
                " unique_key, unique_states) VALUES (gen_random_uuid(), 'reports', %s, '{}', 0,"
                " now(), 3, %s, %s)",
                [TYPE, stored.unique_key, stored.unique_states],
            )
            committer = threading.Timer(0.5, other.commit)
            committer.start()
            started = time.monotonic()
            assert control.retry_dead_jobs([dead_letter.pk]) == 0
            assert time.monotonic() - started >= 0.4  # it waited for the other transaction
            committer.join()
            assert status(dead_letter) == "dead"
        finally:
            other.execute("DELETE FROM jobs WHERE unique_key = %s", [stored.unique_key])
            other.commit()
            other.close()


class TestAnIdempotencyKeyRepeated:
    """The idempotency key says "this very request again": its job is the answer, even once it
    finished and another job holds the unique key."""

    def test_returns_its_own_job_not_the_holder(self) -> None:
        first = unique({"a": 1}, unique=True, idempotency_key="k")
        (claimed,) = claim()
        record(completed(claimed))
        holder = unique({"a": 1}, unique=True, idempotency_key="other")
        again = unique({"a": 1}, unique=True, idempotency_key="k")
        assert holder.pk != first.pk
        assert (again.pk, again.created) == (first.pk, False)

    def test_with_replace_it_leaves_the_holder_as_it_is(self) -> None:
        spec: dict[str, Any] = {"unique": Unique(keys=["a"]), "on_conflict": "replace"}
        first = unique({"a": 1, "v": 1}, idempotency_key="k", **spec)
        (claimed,) = claim()
        record(completed(claimed))
        holder = unique({"a": 1, "v": 2}, idempotency_key="other", **spec)
        again = unique({"a": 1, "v": 3}, idempotency_key="k", **spec)
        assert again.pk == first.pk
        assert Job.objects.get(pk=holder.pk).payload == {"a": 1, "v": 2}


class TestDeclaredWithASequence:
    def test_unique_and_sequence_by_on_one_job_type_are_refused_at_registration(
        self, registry: None
    ) -> None:
        with pytest.raises(JobRegistrationError, match="sequence_by"):

            @job("tests.unique.sequenced", unique=True, sequence_by="account")
            def handler(payload: dict[str, Any], ctx: Any) -> None:
                pass

        with pytest.raises(JobRegistrationError, match="sequence_by"):

            @job("tests.unique.sequenced", debounce=1, sequence_by="account")
            def debounced(payload: dict[str, Any], ctx: Any) -> None:
                pass
