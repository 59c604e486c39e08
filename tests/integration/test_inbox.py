"""accept_message(): a message received once, in the transaction that handles it; its duplicates
refused while they are kept, however many deliveries race; retention; the admin; the errors."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import secrets
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import Client
from django.utils import timezone

from django_pgoutbox import InboxAutocommitWarning, InboxError, accept_message, publish
from django_pgoutbox.maintenance import prune, prune_job
from django_pgoutbox.models import InboxMessage, OutboxEvent

pytestmark = pytest.mark.django_db

INBOX = "/admin/pgoutbox/inboxmessage/"


class TestAccept:
    def test_first_true_then_false(self) -> None:
        assert accept_message("stripe", "evt_1") is True
        assert accept_message("stripe", "evt_1") is False
        assert accept_message("github", "evt_1") is True  # another source's id is another message
        assert accept_message("stripe", "EVT_1") is True  # ids are compared exactly
        row = InboxMessage.objects.get(source="stripe", message_id="evt_1")
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            (now,) = cursor.fetchone()
        assert row.received_at == now  # the database clock, at the transaction's start

    def test_one_statement(self) -> None:
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as queries:
            accept_message("stripe", "evt_1")
        assert [q["sql"] for q in queries.captured_queries if "inbox" in q["sql"]] == [
            q["sql"] for q in queries.captured_queries
        ]
        assert len(queries.captured_queries) == 1

    def test_text_is_kept_exactly_as_given(self) -> None:
        composed, decomposed = "caf\u00e9", "cafe\u0301"  # the same word, two spellings
        assert accept_message("s", composed) is True
        assert accept_message("s", decomposed) is True
        assert accept_message("s", " evt") is True
        assert accept_message("s", "evt") is True
        assert sorted(InboxMessage.objects.values_list("message_id", flat=True)) == sorted(
            [composed, decomposed, " evt", "evt"]
        )

    def test_the_largest_source_and_id_fit_the_unique_index(self) -> None:
        # Random text does not compress: the index entry is as large as it can be.
        source = "😀" * 63 + "abc"  # 255 bytes
        message_id = secrets.token_hex(1024)  # 2,048 bytes
        assert len(source.encode()) == 255
        assert accept_message(source, message_id) is True
        assert accept_message(source, message_id) is False
        multibyte = "".join(chr(0x4E00 + secrets.randbelow(20000)) for _ in range(682)) + "ab"
        assert len(multibyte.encode()) == 2048
        assert accept_message(source, multibyte) is True

    def test_no_warning_inside_a_transaction(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with transaction.atomic():
                assert accept_message("stripe", "evt_1") is True

    def test_a_str_subclass_is_stored_as_its_text(self) -> None:
        class Tagged(str):
            def __str__(self) -> str:
                return "something else"

        assert accept_message(Tagged("stripe"), Tagged("evt_1")) is True
        assert accept_message("stripe", "evt_1") is False


@pytest.mark.django_db(transaction=True)  # real commits and rollbacks, and autocommit
class TestTransactions:
    def test_rolled_back_is_accepted_again(self) -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            assert accept_message("stripe", "evt_1") is True
            raise RuntimeError("handling failed")
        assert not InboxMessage.objects.exists()
        with transaction.atomic():
            assert accept_message("stripe", "evt_1") is True
        with transaction.atomic():
            assert accept_message("stripe", "evt_1") is False

    def test_a_savepoint_rolled_back_forgets_it_too(self) -> None:
        with transaction.atomic():
            with pytest.raises(RuntimeError), transaction.atomic():
                assert accept_message("stripe", "evt_1") is True
                raise RuntimeError("handling failed")
            assert accept_message("stripe", "evt_1") is True

    def test_autocommit_records_at_once_and_warns(self) -> None:
        assert connection.get_autocommit()
        with pytest.warns(InboxAutocommitWarning, match="outside a transaction") as caught:
            assert accept_message("stripe", "evt_1") is True
        assert caught[0].filename == __file__  # points at the caller
        with pytest.warns(InboxAutocommitWarning):
            assert accept_message("stripe", "evt_1") is False
        assert InboxMessage.objects.count() == 1

    def test_the_warning_can_be_an_error(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("error", InboxAutocommitWarning)
            with pytest.raises(InboxAutocommitWarning):
                accept_message("stripe", "evt_1")
        assert not InboxMessage.objects.exists()


def _deliver_concurrently(
    deliveries: int, deliver: Callable[[int], bool]
) -> tuple[list[bool], list[BaseException]]:
    """Run ``deliver(i)`` on ``deliveries`` threads, each with its own connection; collect what
    each answered and what each raised."""
    answers: list[bool] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run(index: int) -> None:
        try:
            answer = deliver(index)
            with lock:
                answers.append(answer)
        except BaseException as exc:
            with lock:
                errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(deliveries)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    return answers, errors


def _handle(source: str, message_id: str) -> bool:
    """What a webhook view does: record the message, and publish its fact only if it is new."""
    with transaction.atomic():
        accepted = accept_message(source, message_id)
        if accepted:
            publish(
                "payment.received",
                aggregate_type="payment",
                aggregate_id=uuid.uuid4(),
                payload={"message": message_id},
            )
        time.sleep(0.05)  # hold the row while the other deliveries arrive
        return accepted


def _lock_waiters() -> int:
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.django_db(transaction=True)  # each thread's connection must see the others' commits
class TestConcurrentDeliveries:
    def test_eight_at_once_make_one_event(self) -> None:
        barrier = threading.Barrier(8)

        def deliver(index: int) -> bool:
            barrier.wait(timeout=10)
            return _handle("stripe", "evt_race")

        answers, errors = _deliver_concurrently(8, deliver)
        assert errors == []
        assert sorted(answers) == [False] * 7 + [True]
        assert OutboxEvent.objects.filter(event_type="payment.received").count() == 1
        assert InboxMessage.objects.filter(message_id="evt_race").count() == 1

    def test_eight_behind_a_holder_that_rolls_back_make_one_event(self) -> None:
        holding = threading.Event()
        release = threading.Event()
        holder_errors: list[BaseException] = []

        def holder() -> None:
            try:
                with pytest.raises(RuntimeError), transaction.atomic():
                    assert accept_message("stripe", "evt_race") is True
                    publish(
                        "payment.received",
                        aggregate_type="payment",
                        aggregate_id=uuid.uuid4(),
                        payload={"from": "holder"},
                    )
                    holding.set()
                    assert release.wait(timeout=30)
                    raise RuntimeError("the first delivery failed")
            except BaseException as exc:
                holder_errors.append(exc)
            finally:
                connections.close_all()

        first = threading.Thread(target=holder)
        first.start()
        assert holding.wait(timeout=10)
        waiters = _lock_waiters()
        result: dict[str, Any] = {}

        def deliveries() -> None:
            result["answers"], result["errors"] = _deliver_concurrently(
                8, lambda i: _handle("stripe", "evt_race")
            )

        runner = threading.Thread(target=deliveries)
        runner.start()
        _wait_for(lambda: _lock_waiters() == waiters + 8)  # all eight wait on the holder's row
        release.set()
        first.join(timeout=30)
        runner.join(timeout=60)
        assert holder_errors == []
        assert result["errors"] == []
        assert sorted(result["answers"]) == [False] * 7 + [True]
        events = list(OutboxEvent.objects.filter(event_type="payment.received"))
        assert len(events) == 1
        assert events[0].payload == {"message": "evt_race"}  # not the holder's, rolled back

    def test_batches_accepted_in_sorted_order_never_deadlock(self) -> None:
        """Two requests that carry the same messages in different orders: accepted sorted, as
        docs/howto/webhooks-in.md says, each finishes and each message is handled once (in
        their order as given, one of them would be aborted by the deadlock detector)."""
        batches = [["m3", "m1", "m2"], ["m2", "m3", "m1"], ["m1", "m2", "m3"], ["m2", "m1"]]
        barrier = threading.Barrier(len(batches))

        def deliver(index: int) -> bool:
            with transaction.atomic():
                barrier.wait(timeout=10)
                accepted = [accept_message("batch", m) for m in sorted(batches[index])]
                time.sleep(0.05)
            return any(accepted)

        answers, errors = _deliver_concurrently(len(batches), deliver)
        assert errors == []
        assert len(answers) == len(batches)
        assert sorted(InboxMessage.objects.values_list("message_id", flat=True)) == [
            "m1",
            "m2",
            "m3",
        ]

    def test_repeatable_read_gets_a_serialization_failure_to_retry(self) -> None:
        """At REPEATABLE READ, a delivery whose snapshot predates the other's commit cannot
        see the row it conflicts with: PostgreSQL says so rather than answer False for a row
        the transaction cannot read (docs/howto/webhooks-in.md)."""
        params = connection.get_connection_params()
        with psycopg.connect(**params) as late, psycopg.connect(**params) as first:
            late.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            late.execute("SELECT 1")  # its snapshot is taken here
            first.execute(
                "INSERT INTO inbox_messages (source, message_id) VALUES ('stripe', 'evt_rr')"
            )
            first.commit()
            with pytest.raises(psycopg.errors.SerializationFailure):
                late.execute(
                    "INSERT INTO inbox_messages (source, message_id) VALUES ('stripe', 'evt_rr') "
                    "ON CONFLICT (source, message_id) DO NOTHING RETURNING received_at"
                )


class TestErrors:
    def test_not_postgresql(self, lite: str) -> None:
        with pytest.raises(InboxError) as raised:
            accept_message("stripe", "evt_1", using=lite)
        assert raised.value.field == "using"
        assert "'lite' is SQLite, not PostgreSQL" in str(raised.value)

    def test_the_routers_choice(self, lite: str, settings: Any) -> None:
        settings.DATABASE_ROUTERS = ["tests.integration.test_first_use.ToLite"]
        with pytest.raises(InboxError, match="'lite' is SQLite"):
            accept_message("stripe", "evt_1")

    def test_a_database_not_migrated_since_the_inbox(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE inbox_messages")  # the test's transaction rolls back
        with pytest.raises(InboxError) as raised:
            accept_message("stripe", "evt_1")
        assert raised.value.field == "using"
        message = str(raised.value)
        assert message.startswith("using: database 'default' lacks django-pgoutbox migrations")
        assert 'relation "inbox_messages" does not exist' in message
        assert message.endswith("run `manage.py migrate pgoutbox`.")

    @pytest.mark.django_db(databases=["default", "secondary"])
    def test_another_postgresql_database(self) -> None:
        assert accept_message("stripe", "evt_1", using="secondary") is True
        assert accept_message("stripe", "evt_1", using="secondary") is False
        assert accept_message("stripe", "evt_1") is True  # default: another inbox


class TestRetention:
    def age(self, message_id: str, by: timedelta) -> None:
        InboxMessage.objects.filter(message_id=message_id).update(received_at=timezone.now() - by)

    def test_prune_removes_old_messages_only(self, settings: Any) -> None:
        settings.PGOUTBOX = {**settings.PGOUTBOX, "RETENTION": {"INBOX_MESSAGES": 3600}}
        for message_id in ("old-1", "old-2", "old-3", "recent", "fresh"):
            accept_message("stripe", message_id)
        for message_id in ("old-1", "old-2", "old-3"):
            self.age(message_id, timedelta(hours=2))
        self.age("recent", timedelta(minutes=59))
        result = prune(batch=2)
        assert result.inbox_messages == 3
        assert sorted(InboxMessage.objects.values_list("message_id", flat=True)) == [
            "fresh",
            "recent",
        ]
        assert accept_message("stripe", "old-1") is True  # forgotten: accepted again
        assert accept_message("stripe", "recent") is False

    def test_default_keeps_them_seven_days(self) -> None:
        accept_message("stripe", "six-days")
        accept_message("stripe", "eight-days")
        self.age("six-days", timedelta(days=6))
        self.age("eight-days", timedelta(days=8))
        assert prune().inbox_messages == 1
        assert list(InboxMessage.objects.values_list("message_id", flat=True)) == ["six-days"]

    def test_none_keeps_them_forever(self, settings: Any) -> None:
        settings.PGOUTBOX = {**settings.PGOUTBOX, "RETENTION": {"INBOX_MESSAGES": None}}
        accept_message("stripe", "ancient")
        self.age("ancient", timedelta(days=9999))
        assert prune().inbox_messages == 0
        assert accept_message("stripe", "ancient") is False

    def test_the_command_and_the_built_in_job_count_them(self) -> None:
        accept_message("stripe", "old")
        self.age("old", timedelta(days=30))
        out = StringIO()
        call_command("pgoutbox", "prune", stdout=out)
        assert "0 processed events, 1 inbox messages, 0 stale heartbeats," in out.getvalue()
        accept_message("stripe", "old")
        self.age("old", timedelta(days=30))
        result = prune_job({}, _context())
        assert result["inbox_messages"] == 1

    @pytest.mark.parametrize("bad", [-1, 0, "7d", float("nan"), timedelta(days=-1), 1e300])
    def test_a_bad_value_fails_the_check_naming_the_key(self, bad: Any) -> None:
        from django_pgoutbox.conf import parse_settings

        _, problems = parse_settings({"RETENTION": {"INBOX_MESSAGES": bad}})
        assert [(p.check_id, p.key) for p in problems] == [
            ("pgoutbox.E004", "PGOUTBOX['RETENTION']['INBOX_MESSAGES']")
        ]

    def test_a_bad_value_fails_manage_py_check(self, settings: Any) -> None:
        from django_pgoutbox import checks

        settings.PGOUTBOX = {**settings.PGOUTBOX, "RETENTION": {"INBOX_MESSAGES": "a week"}}
        messages = [m for m in checks.check_settings(None) if m.id == "pgoutbox.E004"]
        assert len(messages) == 1
        assert "PGOUTBOX['RETENTION']['INBOX_MESSAGES']" in messages[0].msg


def _context() -> Any:
    from django_pgoutbox.context import JobContext

    return JobContext(
        job_id=uuid.uuid4(),
        job_type="pgoutbox.prune",
        attempt=1,
        organization_id=None,
        queue="default",
        logger=logging.LoggerAdapter(logging.getLogger("tests")),
    )


class TestAdmin:
    def test_read_only_list_filter_and_search(self, admin_client: Client) -> None:
        for source, message_id in (("stripe", "evt_1"), ("stripe", "evt_2"), ("github", "evt_1")):
            accept_message(source, message_id)
        accept_message("github", "d6a1e1d0-c0ff-ee00-0000-000000000000")
        page = admin_client.get(INBOX)
        assert page.status_code == 200
        assert page.content.count(b'class="field-source"') == 4
        text = page.content.decode()
        assert "?source=github" in text  # the filter's choices
        assert "?source=stripe" in text
        filtered = admin_client.get(INBOX + "?source=stripe")
        assert filtered.content.count(b'class="field-source"') == 2
        searched = admin_client.get(INBOX + "?q=evt_1")
        assert searched.content.count(b'class="field-source"') == 2
        both = admin_client.get(INBOX + "?source=github&q=evt_1")
        assert both.content.count(b'class="field-source"') == 1
        assert admin_client.get(INBOX + "?q=evt").content.count(b'class="field-source"') == 0
        assert admin_client.get(INBOX + "add/").status_code == 403
        row = InboxMessage.objects.get(source="stripe", message_id="evt_1")
        detail = admin_client.get(f"{INBOX}{row.pk}/change/")
        assert detail.status_code == 200
        assert b'name="_save"' not in detail.content
        assert admin_client.post(f"{INBOX}{row.pk}/change/", {}).status_code == 403
        assert admin_client.get(f"{INBOX}{row.pk}/delete/").status_code == 403
        assert admin_client.get(INBOX + "?o=1").status_code == 200

    @pytest.mark.parametrize(
        "query", ["?q=%00", "?q=%ED%A0%80", "?q=" + "x" * 5000, "?q=%20%20", "?message_id=x"]
    )
    def test_odd_queries_are_answered(self, admin_client: Client, query: str) -> None:
        accept_message("stripe", "evt_1")
        assert admin_client.get(INBOX + query).status_code in (200, 302, 400), query

    def test_a_source_filter_with_a_nul_is_answered(self, admin_client: Client) -> None:
        accept_message("stripe", "evt_1")
        assert admin_client.get(INBOX + "?source=%00").status_code in (200, 400)


def _signed(body: bytes, *, at: float | None = None, secret: str = "whsec_example") -> str:
    timestamp = int(time.time() if at is None else at)
    signed = f"{timestamp}.".encode() + body
    return f"t={timestamp},v1={hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()}"


def _event(event_id: str, order_id: uuid.UUID) -> bytes:
    return json.dumps(
        {
            "id": event_id,
            "type": "checkout.session.completed",
            "data": {"object": {"client_reference_id": str(order_id), "amount_total": 4200}},
        }
    ).encode()


def _post(client: Client, body: bytes, signature: str | None) -> Any:
    headers = {} if signature is None else {"Stripe-Signature": signature}
    return client.post("/webhooks/stripe/", body, content_type="application/json", headers=headers)


class TestWebhookView:
    """The view of docs/howto/webhooks-in.md, through Django's test client."""

    def test_it_is_the_page_s_view(self) -> None:
        from pathlib import Path

        from testproject.demo import webhooks

        page = (Path(__file__).parents[2] / "docs" / "howto" / "webhooks-in.md").read_text()
        block = re.search(r"```python\n# myapp/webhooks.py\n(.*?)```", page, re.S)
        assert block is not None
        assert Path(webhooks.__file__).read_text().endswith(block.group(1))

    def test_first_delivery_then_duplicates_answer_200_and_publish_once(self) -> None:
        client, order = Client(), uuid.uuid4()
        body = _event("evt_1", order)
        for _ in range(3):
            assert _post(client, body, _signed(body)).status_code == 200
        assert OutboxEvent.objects.filter(event_type="order.paid", aggregate_id=order).count() == 1
        assert InboxMessage.objects.filter(source="stripe", message_id="evt_1").count() == 1

    @pytest.mark.parametrize(
        "signature",
        [
            None,
            "",
            "t=abc,v1=00",
            "v1=" + "0" * 64,
            "signed",
            "t=-5,v1=" + "0" * 64,
        ],
    )
    def test_a_bad_signature_is_a_400_and_records_nothing(self, signature: str | None) -> None:
        body = _event("evt_2", uuid.uuid4())
        assert _post(Client(), body, signature).status_code == 400
        assert not InboxMessage.objects.exists()
        assert not OutboxEvent.objects.exists()

    def test_a_signature_of_other_bytes_or_secret_or_time_is_a_400(self) -> None:
        body = _event("evt_3", uuid.uuid4())
        other = _event("evt_4", uuid.uuid4())
        for signature in (
            _signed(other),
            _signed(body, secret="whsec_other"),
            _signed(body, at=time.time() - 3600),
        ):
            assert _post(Client(), body, signature).status_code == 400
        assert not InboxMessage.objects.exists()
        assert _post(Client(), body, _signed(body)).status_code == 200

    @pytest.mark.parametrize(
        "body",
        [b"not json", b"[]", b'{"id": "evt_5"}', b'{"id": 5, "type": "x", "data": {"object": {}}}'],
    )
    def test_a_signed_body_that_is_no_event_is_a_400(self, body: bytes) -> None:
        assert _post(Client(), body, _signed(body)).status_code == 400
        assert not InboxMessage.objects.exists()

    def test_other_event_types_are_recorded_and_publish_nothing(self) -> None:
        body = json.dumps({"id": "evt_6", "type": "charge.refunded", "data": {"object": {}}})
        assert _post(Client(), body.encode(), _signed(body.encode())).status_code == 200
        assert InboxMessage.objects.filter(message_id="evt_6").exists()
        assert not OutboxEvent.objects.exists()

    def test_get_is_refused(self) -> None:
        assert Client().get("/webhooks/stripe/").status_code == 405

    @pytest.mark.django_db(transaction=True)  # each request's thread has its own connection
    def test_eight_concurrent_deliveries_answer_200_and_publish_once(self) -> None:
        order = uuid.uuid4()
        body = _event("evt_race", order)
        barrier = threading.Barrier(8)

        def deliver(index: int) -> bool:
            client = Client()
            barrier.wait(timeout=10)
            return bool(_post(client, body, _signed(body)).status_code == 200)

        answers, errors = _deliver_concurrently(8, deliver)
        assert errors == []
        assert answers == [True] * 8
        assert OutboxEvent.objects.filter(event_type="order.paid", aggregate_id=order).count() == 1
