"""WebhookPublisher against a real HTTP server on the loopback interface: what it sends (a
signed CloudEvent), and what each answer means for the job that sends it."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from django_pgoutbox import publish
from django_pgoutbox.errors import PermanentError, RateLimited, TransientError
from django_pgoutbox.publishers import (
    InvalidSignature,
    WebhookPublisher,
    register,
    retry_after,
    sign,
    unregister,
    verify_webhook,
    webhook_secret,
)
from tests.webhook_server import Answer, Server

SECRET = "whsec_" + "c2VjcmV0LW9mLXRoaXJ0eS10d28tYnl0ZXMtLS0tLS0="  # base64 of 32 bytes


@pytest.fixture
def server() -> Iterator[Server]:
    running = Server()
    yield running
    running.close()


def event(**payload: Any) -> Any:
    return publish(
        "order.placed", aggregate_type="order", aggregate_id=uuid.uuid4(), payload=payload
    )


def publisher(url: str, **options: Any) -> WebhookPublisher:
    return WebhookPublisher("shop", url, secret=SECRET, **{"timeout": 2.0, **options})


@pytest.mark.django_db
class TestWhatIsSent:
    def test_a_signed_cloudevent(self, server: Server) -> None:
        fact = event(total=12.5, items=["a"])
        publisher(server.url, headers={"Authorization": "Bearer t"}).publish(fact)
        (got,) = server.received
        assert got.path == "/hooks"
        assert got.headers["Content-Type"] == "application/cloudevents+json"
        assert got.headers["Authorization"] == "Bearer t"
        body = json.loads(got.body)
        assert body == fact.as_cloudevent()
        assert (body["id"], body["subject"], body["data"]) == (
            str(fact.id),
            str(fact.aggregate_id),
            {"total": 12.5, "items": ["a"]},
        )
        assert got.headers["webhook-id"] == str(fact.id)
        verify_webhook(SECRET, got.headers, got.body)  # what a receiver does
        with pytest.raises(InvalidSignature, match="no signature matches"):
            verify_webhook(SECRET, got.headers, got.body + b" ")
        with pytest.raises(InvalidSignature, match="no signature matches"):
            verify_webhook("another-secret-of-16+-bytes", got.headers, got.body)
        with pytest.raises(InvalidSignature, match="outside the tolerance"):
            verify_webhook(SECRET, got.headers, got.body, now=time.time() + 301)

    @pytest.mark.parametrize("stamp", ["9" * 400, "9" * 5000, "1" + "0" * 30])
    def test_a_huge_timestamp_is_an_invalid_signature(self, stamp: str) -> None:
        """What a hostile request can send: InvalidSignature (a 400), never an OverflowError
        (a float cannot hold it) or a ValueError (int() refuses over 4,300 digits)."""
        headers = {"webhook-id": "msg_1", "webhook-timestamp": stamp}
        headers["webhook-signature"] = "v1,x"
        with pytest.raises(InvalidSignature):
            verify_webhook(SECRET, headers, b"{}")

    @pytest.mark.parametrize("tolerance", [float("nan"), -1, "300", None])
    def test_a_tolerance_that_would_accept_any_time_is_refused(self, tolerance: Any) -> None:
        key = webhook_secret(SECRET)
        headers = {
            "webhook-id": "m",
            "webhook-timestamp": "1",
            "webhook-signature": sign(key, "m", 1, b""),
        }
        with pytest.raises(ValueError, match="tolerance"):
            verify_webhook(SECRET, headers, b"", tolerance=tolerance)

    def test_the_signature_is_the_standard_webhooks_one(self) -> None:
        """The example of the Standard Webhooks specification, recomputed."""
        key = webhook_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        body = b'{"test": 2432232314}'
        assert (
            sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
            == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        )

    def test_a_source_of_its_own(self, server: Server) -> None:
        publisher(server.url, source="https://shop.example.com").publish(event())
        assert json.loads(server.received[0].body)["source"] == "https://shop.example.com"


@pytest.mark.django_db
class TestWhatAnAnswerMeans:
    @pytest.mark.parametrize(
        ("answer", "error", "code"),
        [
            (Answer(500, body=b"boom"), TransientError, "http_500"),
            (Answer(502), TransientError, "http_502"),
            (Answer(503), TransientError, "http_503"),
            (Answer(408), TransientError, "http_408"),
            (Answer(429), RateLimited, "http_429"),
            (Answer(400, body=b'{"error": "bad field"}'), PermanentError, "http_400"),
            (Answer(404), PermanentError, "http_404"),
            (Answer(410), PermanentError, "http_410"),
            (Answer(301, {"Location": "https://new.example/h"}), PermanentError, "http_301"),
        ],
    )
    def test_each_status(
        self, server: Server, answer: Answer, error: type[Exception], code: str
    ) -> None:
        server.answers.append(answer)
        with pytest.raises(error) as raised:
            publisher(server.url).publish(event())
        assert getattr(raised.value, "code", None) == code
        assert str(raised.value).startswith(f"HTTP {answer.status}")
        if answer.body:
            assert answer.body.decode() in str(raised.value)
        if answer.status == 301:
            assert "'https://new.example/h': publish to that URL instead" in str(raised.value)
        assert len(server.received) == 1  # no retry of its own, no redirect followed

    def test_2xx_is_delivered(self, server: Server) -> None:
        server.answers += [Answer(202), Answer(204)]
        publisher(server.url).publish(event())
        publisher(server.url).publish(event())

    def test_retry_after_in_seconds_and_as_a_date(self, server: Server) -> None:
        server.answers.append(Answer(429, {"Retry-After": "7"}))
        with pytest.raises(RateLimited) as raised:
            publisher(server.url).publish(event())
        assert raised.value.retry_after == 7.0
        later = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 120))
        server.answers.append(Answer(503, {"Retry-After": later}))
        with pytest.raises(RateLimited) as raised:
            publisher(server.url).publish(event())
        assert 100 < (raised.value.retry_after or 0) <= 120

    @pytest.mark.parametrize("value", ["soon", "-5", "", "1e9", "Mon, 99 Foo 2026"])
    def test_an_unreadable_retry_after_is_no_hint(self, value: str) -> None:
        assert retry_after(value) is None

    def test_a_huge_retry_after_is_cut(self, server: Server) -> None:
        server.answers.append(Answer(429, {"Retry-After": "9" * 40}))
        with pytest.raises(RateLimited) as raised:
            publisher(server.url).publish(event())
        assert (raised.value.retry_after or 0) <= 10**11

    def test_a_long_body_is_cut_in_the_error(self, server: Server) -> None:
        server.answers.append(Answer(400, body=b"\x00\xff" + b"y" * 5_000_000))
        with pytest.raises(PermanentError) as raised:
            publisher(server.url).publish(event())
        assert len(str(raised.value)) < 400

    def test_nobody_listening(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]  # closed again: nothing listens there
        with pytest.raises(TransientError) as raised:
            publisher(f"http://127.0.0.1:{port}/h").publish(event())
        assert raised.value.code == "http_unreachable"

    def test_an_answer_that_never_comes(self, server: Server) -> None:
        server.answers.append(Answer(delay=3.0))
        started = time.monotonic()
        with pytest.raises(TransientError, match=r"ReadTimeout|timed out"):
            publisher(server.url, timeout=0.5).publish(event())
        assert time.monotonic() - started < 2.5

    def test_a_body_that_drips_or_never_ends_cannot_hold_the_job(self, server: Server) -> None:
        server.answers.append(Answer(500, body=b"z" * 100, drip=0.2))
        started = time.monotonic()
        with pytest.raises(TransientError):
            publisher(server.url, timeout=0.5).publish(event())
        assert time.monotonic() - started < 3.0
        server.answers.append(Answer(200, endless=True))
        started = time.monotonic()
        publisher(server.url, timeout=0.5).publish(event())  # delivered: the rest is not read
        assert time.monotonic() - started < 3.0

    def test_a_head_that_drips_cannot_hold_the_job(self, server: Server) -> None:
        """Headers sent a byte at a time, each within the read timeout: the answer's head must
        still have come within the timeout, or the job would be held for hours (100 header
        lines of 64 KiB); and a head cut off there is no answer, though its status line said
        200."""
        server.answers.append(Answer(head_drip=0.2))
        started = time.monotonic()
        with pytest.raises(TransientError, match=r"ReadTimeout|timed out") as raised:
            publisher(server.url, timeout=0.5).publish(event())
        assert raised.value.code == "http_unreachable"
        assert time.monotonic() - started < 2.5

    def test_a_body_is_read_for_the_timeout_at_most(self, server: Server) -> None:
        """A byte shortly before each read timeout: the read that starts just before the
        deadline must not wait a whole read timeout more."""
        server.answers.append(Answer(500, body=b"z" * 100, drip=0.9))
        started = time.monotonic()
        with pytest.raises(TransientError, match="HTTP 500"):
            publisher(server.url, timeout=1.0).publish(event())
        assert time.monotonic() - started < 1.5

    def test_an_interim_answer_is_not_the_answer(self, server: Server) -> None:
        """A 103 Early Hints (or 102 Processing) comes before the final answer on the same
        connection: it is skipped, so that neither is the event dead for a "103" nor does the
        next event, sent on that connection, read the final answer of this one."""
        server.answers += [
            Answer(200, interim=(103,), delay=0.3),
            Answer(500, body=b"refused", interim=(102, 103), delay=0.3),
        ]
        sending = publisher(server.url)
        sending.publish(event())  # delivered: its final answer is a 200
        with pytest.raises(TransientError) as raised:
            sending.publish(event())
        assert raised.value.code == "http_500"
        assert "refused" in str(raised.value)
        assert len(server.received) == 2

    def test_connections_are_kept_between_events(self, server: Server) -> None:
        sending = publisher(server.url)
        for _ in range(3):
            sending.publish(event())
        assert len(server.received) == 3


class TestConfiguration:
    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"url": "ftp://x/h"}, "url must be an http(s) URL"),
            ({"url": "http:///h"}, "url must be an http(s) URL"),
            ({"url": None}, "url must be an http(s) URL"),
            ({"secret": "short"}, "at least 16 bytes (it has 5)"),
            ({"secret": "whsec_!!"}, "'whsec_' must be followed by base64"),
            ({"secret": 42}, "secret must be str or bytes"),
            ({"timeout": 0}, "timeout must be seconds above 0"),
            ({"timeout": float("nan")}, "timeout must be seconds above 0"),
            ({"timeout": 301}, "at most 300"),
            ({"timeout": True}, "timeout must be seconds above 0"),
        ],
    )
    def test_refused_at_construction(self, options: dict[str, Any], message: str) -> None:
        arguments = {"url": "https://x.example/h", "secret": SECRET, **options}
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            WebhookPublisher("shop", **arguments)

    @pytest.mark.parametrize(
        "headers",
        [
            {"X-A": "a\r\nX-Injected: 1"},  # refused by http.client at each send
            {"X-A": "a\r\n X-Folded: 1"},  # obsolete line folding: sent, refused by servers
            {"X-A": "a\x00b"},
            {"X-A": "\u20ac"},  # not latin-1: UnicodeEncodeError at each send
            {"X A": "1"},
            {"": "1"},
            {"X-A": 5},
            # Sent beside the publisher's own: two signatures, two content types, a wrong length.
            {"Webhook-Signature": "v1,forged"},
            {"WEBHOOK-ID": "x"},
            {"content-type": "text/plain"},
            {"Content-Length": "3"},
            {"Transfer-Encoding": "chunked"},
        ],
    )
    def test_headers_it_cannot_send(self, headers: dict[str, Any]) -> None:
        with pytest.raises(ValueError, match="headers"):
            WebhookPublisher("shop", "https://x.example/h", secret=SECRET, headers=headers)

    @pytest.mark.parametrize("name", ["", "  ", "a\x00b", "\ud800", "x" * 256, None, 7])
    def test_a_name_it_cannot_keep(self, name: Any) -> None:
        sending = WebhookPublisher("shop", "https://x.example/h", secret=SECRET)
        sending.name = name
        with pytest.raises(ValueError, match="printable text of 1 to 255 bytes"):
            register(sending)

    @pytest.mark.parametrize(
        "payload", [[], "shop", None, 7, ["publisher", "event"], {"publisher": 5, "event": "x"}]
    )
    def test_a_payload_that_is_not_an_object_is_dead_at_once(self, payload: Any) -> None:
        """A job's payload changed by hand (no constraint keeps it an object): a PermanentError,
        not an AttributeError retried as an unexpected error."""
        from django_pgoutbox.publishers import publish_event

        with pytest.raises(PermanentError, match="payload"):
            publish_event(payload, None)  # type: ignore[arg-type]

    @pytest.mark.usefixtures("registry")
    def test_send_events_twice_for_one_publisher(self) -> None:
        """The second call replaced the first's subscriber (one name, pgoutbox.publish:<name>):
        the first call's event types were no longer sent, and nothing said so."""
        from django_pgoutbox.outbox import subscribers_for
        from django_pgoutbox.publishers import send_events

        sending = WebhookPublisher("twice-sent", "https://x.example/h", secret=SECRET)
        try:
            send_events(sending, "tests.first")
            send_events(sending, "tests.first")  # the same call again (a module re-imported)
            with pytest.raises(ValueError, match="in one call"):
                send_events(sending, "tests.second")
            assert [s.name for s in subscribers_for("tests.first")] == [
                "pgoutbox.publish:twice-sent"
            ]
            assert subscribers_for("tests.second") == []
        finally:
            unregister("twice-sent")

    def test_two_publishers_of_one_name(self) -> None:
        first = WebhookPublisher("twice", "https://x.example/h", secret=SECRET)
        register(first)
        try:
            register(first)  # the same one again: a module imported twice
            with pytest.raises(ValueError, match="registered already"):
                register(WebhookPublisher("twice", "https://y.example/h", secret=SECRET))
        finally:
            unregister("twice")
