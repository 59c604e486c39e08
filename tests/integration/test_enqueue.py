"""enqueue() and enqueue_many(): transactions, idempotency, wake-ups, bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_pgoutbox import EnqueueError, enqueue, enqueue_many, job
from django_pgoutbox.copy_rows import COPY_MIN_ROWS, EnqueuedJobs
from django_pgoutbox.insert_rows import ENQUEUE_CHUNK_SIZE
from django_pgoutbox.models import Job, JobStatus
from django_pgoutbox.queries import COPY_JOBS
from tests.conftest import drain_notifications
from tests.processes import ROOT, database_url_for_tests, other_backends, wait_for

pytestmark = pytest.mark.django_db


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        value: datetime = cursor.fetchone()[0]
    return value


class TestEnqueue:
    def test_returns_a_saved_pending_job_with_database_defaults(self) -> None:
        before = db_now()
        created = enqueue("reports.build", {"report": 7}, queue="reports", priority=3)
        stored = Job.objects.get(pk=created.pk)
        assert created.pk == stored.pk
        assert created._state.adding is False
        assert (stored.status, stored.queue, stored.job_type) == (
            "pending",
            "reports",
            "reports.build",
        )
        assert stored.payload == {"report": 7}
        assert (stored.priority, stored.attempts, stored.max_attempts) == (3, 0, 10)
        assert stored.run_at == created.run_at
        assert stored.created_at == created.created_at
        assert stored.run_at >= before
        assert stored.id.version == 7

    @pytest.mark.smoke
    def test_one_statement_per_new_job(self, django_assert_num_queries: Any) -> None:
        with django_assert_num_queries(1):
            enqueue("a.b", {})

    def test_only_a_keyed_job_is_inserted_on_conflict(self) -> None:
        """A job without a key cannot conflict: its insert is not speculative."""
        with CaptureQueriesContext(connection) as captured:
            plain = enqueue("a.b", {})
            keyed = enqueue("a.b", {}, idempotency_key="k")
            again = enqueue("a.b", {"v": 2}, idempotency_key="k")
        sent = [query["sql"] for query in captured.captured_queries]
        assert ["ON CONFLICT" in sql for sql in sent] == [False, True, True, False]
        assert again.pk == keyed.pk != plain.pk  # the fourth statement read the holder
        assert Job.objects.count() == 2

    @pytest.mark.smoke
    def test_rollback_leaves_no_job(self) -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            enqueue("a.b", {"n": 1})
            enqueue_many([{"job_type": "a.b", "payload": {"n": 2}}])
            assert Job.objects.count() == 2
            raise RuntimeError("business failure")
        assert Job.objects.count() == 0

    def test_run_at_absolute_and_delay(self) -> None:
        later = timezone.now() + timedelta(hours=2)
        assert enqueue("a.b", {}, run_at=later).run_at == later
        before = db_now()
        delayed = enqueue("a.b", {}, run_at=timedelta(minutes=5))
        assert delayed.run_at - before >= timedelta(minutes=5)
        assert delayed.run_at - before < timedelta(minutes=6)

    def test_organization_id_accepts_uuid_strings(self) -> None:
        org = uuid.uuid4()
        assert enqueue("a.b", {}, organization_id=str(org)).organization_id == org

    def test_large_and_deep_payloads_within_limits(self, settings: Any) -> None:
        # {"text":"...","deep":[[...1]]}: 19 characters around the text, 2 * 400 + 1 in "deep".
        text = "x" * (2**20 - 19 - 801)
        big = enqueue("a.b", {"text": text, "deep": _nested(400)})
        assert Job.objects.get(pk=big.pk).payload["text"] == text  # 1 MiB, the default cap
        settings.PGOUTBOX = {**settings.PGOUTBOX, "MAX_PAYLOAD_BYTES": None}
        bigger = enqueue("a.b", {"text": "x" * 10_000_000, "deep": _nested(400)})
        stored = Job.objects.get(pk=bigger.pk)
        assert len(stored.payload["text"]) == 10_000_000

    def test_payload_round_trips_unicode_and_nesting(self) -> None:
        payload = {"name": "Zoë ✓", "nested": {"list": [1, 2.5, None, True, "x"]}, "big": 2**70}
        created = enqueue("a.b", payload)
        assert Job.objects.get(pk=created.pk).payload == payload

    def test_using_names_the_database(self) -> None:
        with pytest.raises(EnqueueError, match="using: no database 'other'"):
            enqueue("a.b", {}, using="other")
        assert enqueue("a.b", {}, using="default")._state.db == "default"


class TestRegisteredDefaults:
    def test_job_declaration_supplies_queue_priority_and_budget(self, registry: None) -> None:
        @job("test.alert", queue="critical_alerts", priority=9, max_attempts=4)
        def alert(payload: dict[str, Any], ctx: Any) -> None:
            pass

        created = alert.enqueue({"device": "d1"})
        assert (created.queue, created.priority, created.max_attempts) == ("critical_alerts", 9, 4)
        overridden = alert.enqueue({}, queue="notifications", priority=1)
        assert (overridden.queue, overridden.priority) == ("notifications", 1)
        by_name = enqueue("test.alert", {})
        assert by_name.queue == "critical_alerts"

    def test_unregistered_type_goes_to_default_queue(self) -> None:
        created = enqueue("deployed.elsewhere", {})
        assert (created.queue, created.max_attempts) == ("default", 10)


class TestIdempotency:
    def test_repeated_key_returns_the_existing_job(self) -> None:
        first = enqueue("a.b", {"v": 1}, idempotency_key="k1")
        second = enqueue("a.b", {"v": 2}, idempotency_key="k1")
        assert second.pk == first.pk
        assert second.payload == {"v": 1}
        assert Job.objects.count() == 1

    def test_key_is_scoped_by_organization_and_type(self) -> None:
        org_a, org_b = uuid.uuid4(), uuid.uuid4()
        ids = {
            enqueue("a.b", {}, idempotency_key="k").pk,
            enqueue("a.b", {}, idempotency_key="k", organization_id=org_a).pk,
            enqueue("a.b", {}, idempotency_key="k", organization_id=org_b).pk,
            enqueue("a.c", {}, idempotency_key="k").pk,
        }
        assert len(ids) == 4
        assert enqueue("a.b", {}, idempotency_key="k", organization_id=org_a).pk in ids
        assert Job.objects.count() == 4

    def test_no_organization_is_one_scope(self) -> None:
        # NULL organization ids must collide too (NULLS NOT DISTINCT), or the key would not hold.
        assert (
            enqueue("a.b", {}, idempotency_key="k").pk == enqueue("a.b", {}, idempotency_key="k").pk
        )
        assert Job.objects.count() == 1

    def test_finished_job_still_holds_its_key(self) -> None:
        first = enqueue("a.b", {}, idempotency_key="k")
        Job.objects.filter(pk=first.pk).update(status=JobStatus.COMPLETED)
        again = enqueue("a.b", {}, idempotency_key="k")
        assert again.pk == first.pk
        assert again.status == JobStatus.COMPLETED

    def test_enqueue_many_mixes_new_existing_and_repeated_keys(self) -> None:
        existing = enqueue("a.b", {"old": True}, idempotency_key="old")
        result = enqueue_many(
            [
                {"job_type": "a.b", "payload": {"i": 0}, "idempotency_key": "new"},
                {"job_type": "a.b", "payload": {"i": 1}, "idempotency_key": "old"},
                {"job_type": "a.b", "payload": {"i": 2}},
                {"job_type": "a.b", "payload": {"i": 3}, "idempotency_key": "new"},
            ]
        )
        assert [j.payload for j in result] == [{"i": 0}, {"old": True}, {"i": 2}, {"i": 0}]
        assert result[1].pk == existing.pk
        assert result[3].pk == result[0].pk
        assert Job.objects.count() == 3

    @pytest.mark.smoke
    @pytest.mark.django_db(transaction=True)
    def test_eight_concurrent_enqueuers_of_one_key_make_one_job(self) -> None:
        # transaction=True: each thread has its own connection, and must see the others' commits.
        workers = 8
        barrier = threading.Barrier(workers)
        results: list[uuid.UUID] = []
        errors: list[BaseException] = []
        lock = threading.Lock()

        def attempt() -> None:
            try:
                with transaction.atomic():
                    barrier.wait(timeout=10)
                    created = enqueue("a.b", {}, idempotency_key="same", organization_id=None)
                    # Hold the transaction open so the others' inserts queue up behind ours.
                    time.sleep(0.05)
                with lock:
                    results.append(created.pk)
            except BaseException as exc:
                with lock:
                    errors.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=attempt) for _ in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert errors == []
        assert len(results) == workers
        assert len(set(results)) == 1
        assert Job.objects.filter(idempotency_key="same").count() == 1

    @pytest.mark.django_db(transaction=True)
    def test_key_is_free_again_when_the_holder_rolls_back(self) -> None:
        # transaction=True: the second enqueue runs on another connection while the first waits.
        started = threading.Event()
        release = threading.Event()

        def holder() -> None:
            try:
                with pytest.raises(RuntimeError), transaction.atomic():
                    enqueue("a.b", {"from": "holder"}, idempotency_key="k")
                    started.set()
                    release.wait(timeout=10)
                    raise RuntimeError("roll back")
            finally:
                connections.close_all()

        thread = threading.Thread(target=holder)
        thread.start()
        assert started.wait(timeout=10)
        threading.Timer(0.2, release.set).start()
        created = enqueue("a.b", {"from": "second"}, idempotency_key="k")  # waits for the holder
        thread.join(timeout=10)
        assert created.payload == {"from": "second"}
        assert list(Job.objects.values_list("payload", flat=True)) == [{"from": "second"}]


class TestEnqueueMany:
    def test_ten_thousand_jobs_in_one_copy(self) -> None:
        items = [{"job_type": "bulk.item", "payload": {"i": i}} for i in range(10_000)]
        with CaptureQueriesContext(connection) as queries:
            created = enqueue_many(items)
        statements = [q["sql"] for q in queries.captured_queries]
        assert [sql for sql in statements if "jobs" in sql] == [COPY_JOBS]
        # now(), the COPY, the wake-up, and at most a savepoint pair
        assert len(statements) <= 5, statements
        assert isinstance(created, EnqueuedJobs)
        assert len(created) == 10_000
        assert [j.payload["i"] for j in created] == list(range(10_000))
        assert Job.objects.count() == 10_000

    def test_keyed_batches_are_inserted_in_chunks(self) -> None:
        items = [
            {"job_type": "bulk.item", "payload": {}, "idempotency_key": str(i)}
            for i in range(ENQUEUE_CHUNK_SIZE + 10)
        ]
        with CaptureQueriesContext(connection) as queries:
            created = enqueue_many(items)
        inserts = [q for q in queries.captured_queries if "INSERT INTO jobs" in q["sql"]]
        assert len(inserts) == 2
        assert isinstance(created, list)
        assert [j.idempotency_key for j in created] == [str(i) for i in range(len(items))]

    def test_copied_rows_are_what_the_jobs_say(self) -> None:
        """Every option, and text that COPY's formats must carry as given, survives the COPY."""
        org = uuid.uuid4()
        later = timezone.now() + timedelta(days=1)
        odd = {"tab": "a\tb", "newline": "x\ny", "backslash": "C:\\dir\\", "accents": "é✓𝄞"}
        items: list[dict[str, Any]] = [
            {"job_type": "bulk.plain", "payload": {"i": i}} for i in range(COPY_MIN_ROWS)
        ]
        items += [
            {"job_type": "bulk.odd\\type", "payload": odd, "queue": "reports", "priority": -7},
            {"job_type": "bulk.org", "payload": {"n": [1.5, None]}, "organization_id": org},
            {"job_type": "bulk.later", "payload": {}, "run_at": later, "priority": 2**31 - 1},
            {"job_type": "bulk.delayed", "payload": {}, "run_at": timedelta(minutes=5)},
        ]
        with transaction.atomic():
            created = list(enqueue_many(items))
            now = db_now()
        stored = {job.id: job for job in Job.objects.all()}
        assert len(stored) == len(items)
        fields = [f.attname for f in Job._meta.concrete_fields]
        for one in created:
            assert one._state.adding is False
            for name in fields:
                assert getattr(one, name) == getattr(stored[one.id], name), (name, one.job_type)
        assert created[COPY_MIN_ROWS].payload == odd
        assert created[COPY_MIN_ROWS].job_type == "bulk.odd\\type"
        assert created[COPY_MIN_ROWS + 1].organization_id == org
        assert created[COPY_MIN_ROWS + 2].run_at == later
        assert created[COPY_MIN_ROWS + 3].run_at == now + timedelta(minutes=5)
        assert created[0].run_at == created[0].created_at == now

    def test_a_bad_item_found_during_the_copy_leaves_the_callers_transaction_usable(
        self,
    ) -> None:
        items: list[Any] = [{"job_type": "bulk.item", "payload": {}}] * 5_000
        items.append({"job_type": "bulk.item", "payload": {"x": float("nan")}})
        with transaction.atomic():
            enqueue("before.bulk", {})
            with pytest.raises(EnqueueError, match=r"items\[5000\]\.payload\['x'\]"):
                enqueue_many(items)
            enqueue("after.bulk", {})
        assert sorted(Job.objects.values_list("job_type", flat=True)) == [
            "after.bulk",
            "before.bulk",
        ]

    def test_a_malformed_item_is_named_before_anything_is_written(
        self, django_assert_num_queries: Any
    ) -> None:
        items: list[Any] = [{"job_type": "bulk.item", "payload": {}}] * 100
        items.append("not a dict")
        with django_assert_num_queries(0), pytest.raises(EnqueueError, match=r"items\[100\]"):
            enqueue_many(items)

    def test_enqueued_jobs_behave_as_a_read_only_list(self) -> None:
        created = enqueue_many(
            [{"job_type": "bulk.item", "payload": {"i": i}} for i in range(COPY_MIN_ROWS)]
        )
        assert isinstance(created, EnqueuedJobs)
        as_list = list(created)
        assert created == as_list
        assert as_list == list(created)
        assert created[0] is created[0] is as_list[0]
        assert created[-1].payload == {"i": COPY_MIN_ROWS - 1}
        assert [j.payload["i"] for j in created[2:5]] == [2, 3, 4]
        assert created != as_list[:-1]
        assert repr(created) == f"<EnqueuedJobs: {COPY_MIN_ROWS} jobs>"
        with pytest.raises(IndexError):
            created[COPY_MIN_ROWS]
        with pytest.raises(TypeError):
            hash(created)

    def test_is_atomic_and_validates_everything_first(self) -> None:
        items: list[dict[str, Any]] = [{"job_type": "a.b", "payload": {}}] * 3
        items.append({"job_type": "a.b", "payload": {"when": datetime.now(UTC)}})
        with pytest.raises(EnqueueError, match=r"items\[3\]\.payload\['when'\]"):
            enqueue_many(items)
        assert Job.objects.count() == 0

    def test_empty_input_writes_nothing(self, django_assert_num_queries: Any) -> None:
        with django_assert_num_queries(0):
            assert enqueue_many([]) == []

    def test_per_item_options(self) -> None:
        org = uuid.uuid4()
        later = timezone.now() + timedelta(days=1)
        created = enqueue_many(
            [
                {"job_type": "a.b", "payload": {}, "queue": "reports", "priority": 5},
                {"job_type": "a.c", "payload": {}, "organization_id": org, "run_at": later},
            ]
        )
        assert (created[0].queue, created[0].priority) == ("reports", 5)
        assert (created[1].organization_id, created[1].run_at) == (org, later)

    @pytest.mark.parametrize(
        ("item", "message"),
        [
            ("not a dict", r"items\[0\]: must be a dict"),
            ({"payload": {}}, r"items\[0\]\.job_type: is required"),
            ({"job_type": "a"}, r"items\[0\]\.payload: is required"),
            ({"job_type": "a", "payload": {}, "colour": 1}, r"items\[0\]: unknown key 'colour'"),
        ],
    )
    def test_malformed_items(self, item: Any, message: str) -> None:
        with pytest.raises(EnqueueError, match=message):
            enqueue_many([item])


class TestBadInput:
    @pytest.mark.parametrize(
        ("kwargs", "field", "message"),
        [
            ({"job_type": ""}, "job_type", "non-empty string"),
            ({"job_type": "   "}, "job_type", "non-empty string"),
            ({"job_type": None}, "job_type", "non-empty string"),
            ({"job_type": "a\x00b"}, "job_type", "NUL"),
            ({"payload": [1, 2]}, "payload", "must be a dict"),
            ({"payload": None}, "payload", "must be a dict"),
            ({"payload": {"at": datetime(2026, 1, 1)}}, "payload['at']", "datetime is not JSON"),
            ({"payload": {"id": uuid.uuid4()}}, "payload['id']", "UUID is not JSON"),
            ({"payload": {"n": [1, {"x": Decimal("1.5")}]}}, "payload['n'][1]['x']", "Decimal"),
            ({"payload": {"s": {1, 2}}}, "payload['s']", "set is not JSON"),
            ({"payload": {"x": float("nan")}}, "payload['x']", "not a JSON number"),
            ({"payload": {"x": float("inf")}}, "payload['x']", "not a JSON number"),
            ({"payload": {1: "one"}}, "payload[1]", "keys must be strings"),
            ({"payload": {"text": "bad\x00byte"}}, "payload['text']", "NUL"),
            ({"payload": {"k\x00": 1}}, "payload key 'k\\x00'", "NUL"),
            ({"payload": {"deep": [["a\x00"]]}}, "payload['deep'][0][0]", "NUL"),
            ({"payload": {"s": "\ud800"}}, "payload['s']", "unpaired surrogate"),
            ({"job_type": "a\udfffb"}, "job_type", "unpaired surrogate"),
            ({"idempotency_key": "k\ud800"}, "idempotency_key", "unpaired surrogate"),
            (
                {"payload": {"deep": _nested(600)}},
                "payload['deep']" + "[0]" * 500,
                "nested more than 500",
            ),
            ({"queue": "nope"}, "queue", "unknown queue 'nope'"),
            ({"queue": 7}, "queue", "must be a string"),
            ({"run_at": datetime(2030, 1, 1)}, "run_at", "naive"),
            ({"run_at": "2030-01-01"}, "run_at", "aware datetime, a timedelta or None"),
            ({"priority": "high"}, "priority", "must be an int"),
            ({"priority": 1.5}, "priority", "must be an int"),
            ({"priority": True}, "priority", "must be an int"),
            ({"priority": 2**31}, "priority", "32-bit"),
            ({"organization_id": "acme"}, "organization_id", "must be a UUID"),
            ({"idempotency_key": ""}, "idempotency_key", "non-empty string"),
            ({"idempotency_key": 12}, "idempotency_key", "non-empty string"),
            ({"idempotency_key": "k\x00"}, "idempotency_key", "NUL"),
        ],
    )
    def test_is_refused_naming_the_field(
        self, kwargs: dict[str, Any], field: str, message: str
    ) -> None:
        arguments: dict[str, Any] = {"job_type": "a.b", "payload": {}, **kwargs}
        with pytest.raises(EnqueueError) as caught:
            enqueue(arguments.pop("job_type"), arguments.pop("payload"), **arguments)
        assert caught.value.field == field
        assert message in caught.value.message
        assert str(caught.value).startswith(f"{field}: ")
        assert Job.objects.count() == 0

    def test_error_is_a_value_error(self) -> None:
        with pytest.raises(ValueError, match="payload"):
            enqueue("a.b", {"x": object()})


@pytest.mark.django_db(transaction=True)
class TestWakeUps:
    # transaction=True: the listener is a second connection and hears only committed work.

    @pytest.mark.smoke
    def test_notify_is_sent_at_commit_once_per_queue(
        self, listener: psycopg.Connection[Any]
    ) -> None:
        with transaction.atomic():
            enqueue("a.b", {}, queue="reports")
            enqueue("a.b", {}, queue="reports")
            enqueue_many([{"job_type": "a.b", "payload": {}, "queue": "webhooks"}] * 50)
            enqueue("a.b", {}, queue="webhooks")
            assert drain_notifications(listener, timeout=0.3) == []
        assert sorted(drain_notifications(listener)) == ["reports", "webhooks"]

    def test_rollback_sends_nothing(self, listener: psycopg.Connection[Any]) -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            enqueue("a.b", {})
            raise RuntimeError
        assert drain_notifications(listener) == []

    def test_repeated_key_sends_nothing(self, listener: psycopg.Connection[Any]) -> None:
        enqueue("a.b", {}, idempotency_key="k")
        assert drain_notifications(listener) == ["default"]
        enqueue("a.b", {}, idempotency_key="k")
        assert drain_notifications(listener) == []

    def test_notify_can_be_turned_off(
        self, listener: psycopg.Connection[Any], settings: Any
    ) -> None:
        settings.PGOUTBOX = {**settings.PGOUTBOX, "NOTIFY": False}
        enqueue("a.b", {})
        assert drain_notifications(listener) == []
        assert Job.objects.count() == 1


class TestClaimIndex:
    def test_claim_predicate_uses_the_partial_index(self) -> None:
        enqueue_many([{"job_type": "a.b", "payload": {}, "queue": "reports"}] * 200)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE jobs")
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute(
                "EXPLAIN SELECT id FROM jobs WHERE queue = %s "
                "AND status IN ('pending', 'retrying') AND run_at <= now() "
                "ORDER BY priority DESC, run_at, created_at, id LIMIT 10 FOR UPDATE SKIP LOCKED",
                ["reports"],
            )
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert "jobs_claim_idx" in plan
        assert "Sort" not in plan


# A client that writes a bulk enqueue, each run in its own process on the test database.
_BULK_CLIENT = """
import sys
from django.db import transaction
from django_pgoutbox import enqueue, enqueue_many
count = int(sys.argv[1])
with transaction.atomic():
    enqueue("bulk.before", {})
    enqueue_many([{"job_type": "bulk.item", "payload": {"n": n}} for n in range(count)])
print("committed", flush=True)
"""


def _bulk_client(count: int) -> subprocess.Popen[str]:
    env = {**os.environ, "DATABASE_URL": database_url_for_tests(), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", _SETUP + _BULK_CLIENT, str(count)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


_SETUP = """
import os, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
django.setup()
"""


@pytest.mark.django_db(transaction=True)  # the client is another process: only commits are seen
class TestBulkEnqueueKilled:
    def test_a_client_killed_during_the_copy_leaves_nothing_and_the_next_one_lands(self) -> None:
        client = _bulk_client(2_000_000)

        def copying() -> bool:
            """the client's COPY is under way"""
            return bool(other_backends("query LIKE 'COPY jobs%%' AND state = 'active'"))

        try:
            wait_for(copying, timeout=60, interval=0.01)
            client.send_signal(signal.SIGKILL)
            client.wait(timeout=10)
        finally:
            if client.poll() is None:
                client.kill()
        wait_for(lambda: not copying(), timeout=30)
        assert Job.objects.count() == 0  # not the enqueue before it, not a row of the COPY

        again = _bulk_client(5_000)
        output, _ = again.communicate(timeout=120)
        assert again.returncode == 0, output
        assert Job.objects.filter(job_type="bulk.item").count() == 5_000
        assert Job.objects.filter(job_type="bulk.before").count() == 1


class TestFromAnEvent:
    """Within ``for_event`` (the relay and the delivery runner call each subscriber in one),
    every job records the event, however it is written; outside it, none does."""

    def test_every_way_of_enqueueing(self) -> None:
        from django_pgoutbox.enqueueing import for_event, prepare_job

        event_id = uuid.uuid4()
        with for_event(event_id):
            one = enqueue("tests.noop", {})
            keyed = enqueue("tests.noop", {}, idempotency_key="from-an-event")
            few = enqueue_many([{"job_type": "tests.noop", "payload": {}}] * 3)
            copied = enqueue_many([{"job_type": "tests.noop", "payload": {}}] * 70)
            later = prepare_job("tests.noop", {})  # written after the block: on commit
        outside = enqueue("tests.noop", {})
        written = later.insert()
        ids = [one.pk, keyed.pk, *(job.pk for job in few), *(job.pk for job in copied)]
        assert {job.event_id for job in [one, keyed, *few, *copied, written]} == {event_id}
        stored = Job.objects.filter(pk__in=[*ids, written.pk]).values_list("event_id", flat=True)
        assert set(stored) == {event_id}
        assert len(stored) == 6 + 70
        assert outside.event_id is None
        assert Job.objects.get(pk=outside.pk).event_id is None
