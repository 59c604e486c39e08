"""Webhooks out: ``WebhookPublisher`` posts an outbox event as a CloudEvents 1.0 JSON body
(structured mode), signed as the Standard Webhooks specification says (``webhook-id``,
``webhook-timestamp``, ``webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">``),
and reads what the answer means for the job that sends it (``refusal``); receivers verify it
with a library of theirs or with ``verify_webhook``. A publisher of ``django_pgoutbox.publishers``
(which exports these names too); docs/howto/webhooks-out.md.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import hashlib
import hmac
import json
import math
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

from django_pgoutbox.errors import PermanentError, RateLimited, TransientError
from django_pgoutbox.models import OutboxEvent

#: What of a refusal's body goes into the error (the rest is not read).
BODY_SHOWN = 300
#: Bytes of a response read at most: a body is read only to be shown.
BODY_READ = 4096
#: A secret shorter than this is refused: HMAC with a guessable key proves nothing.
MIN_SECRET_BYTES = 16
#: Timeouts above this are refused (a lease must outlast the send: see the how-to).
MAX_TIMEOUT = 300.0


def webhook_secret(secret: str | bytes) -> bytes:
    """The key of a secret as Standard Webhooks writes it (``whsec_`` + base64) or raw."""
    if isinstance(secret, str):
        if secret.startswith("whsec_"):
            try:
                return base64.b64decode(secret[len("whsec_") :], validate=True)
            except (binascii.Error, ValueError):
                raise ValueError("secret: 'whsec_' must be followed by base64") from None
        return secret.encode()
    if isinstance(secret, bytes):
        return secret
    raise ValueError(f"secret must be str or bytes, not {type(secret).__name__}")


def sign(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value of Standard Webhooks: ``v1,`` + base64 HMAC-SHA256."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


class InvalidSignature(Exception):
    """``verify_webhook``: the request is not the sender's, or too old or too new."""


def verify_webhook(
    secret: str | bytes,
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance: float = 300.0,
    now: float | None = None,
) -> None:
    """Check a Standard Webhooks signature (what ``WebhookPublisher`` sends); raise
    ``InvalidSignature`` unless one of the signatures is right and the timestamp is within
    ``tolerance`` seconds of ``now``. ``headers`` is looked up in lower case."""
    if (
        isinstance(tolerance, bool)
        or not isinstance(tolerance, int | float)
        or not (math.isfinite(tolerance) and tolerance >= 0)
    ):
        # NaN compares false with everything: it would accept any timestamp.
        raise ValueError(f"tolerance must be a finite number of seconds >= 0, not {tolerance!r}")
    lower = {str(k).lower(): str(v) for k, v in headers.items()}
    message_id = lower.get("webhook-id", "")
    stamp = lower.get("webhook-timestamp", "")
    if not message_id or not stamp.isascii() or not stamp.isdigit():
        raise InvalidSignature("webhook-id or webhook-timestamp missing")
    if len(stamp) > 15:  # beyond the year 30000; int() and float() fail on longer ones
        raise InvalidSignature(f"timestamp {stamp[:20]}... is outside the tolerance")
    timestamp = int(stamp)
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        raise InvalidSignature(f"timestamp {timestamp} is outside the tolerance of {tolerance}s")
    expected = sign(webhook_secret(secret), message_id, timestamp, body)
    for given in lower.get("webhook-signature", "").split():
        if hmac.compare_digest(given.encode(), expected.encode()):
            return
    raise InvalidSignature("no signature matches")


def retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date); None if absent
    or unreadable."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return float(min(int(text[:12]), 10**11))
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def refusal(status: int, headers: Mapping[str, str], shown: str) -> Exception | None:
    """What a response of ``status`` means for the job (None: delivered).

    2xx delivered; 429 (with or without a ``Retry-After``), and 503 with one, ``RateLimited``
    with the hint (None: the policy's back-off); 408 and 5xx ``TransientError``; a redirect
    ``PermanentError`` (a signed body is not sent on to another address: give the new URL); any
    other 4xx ``PermanentError`` (the request will never be taken). Codes ``http_<status>``."""
    if 200 <= status < 300:
        return None
    lower = {str(k).lower(): str(v) for k, v in headers.items()}
    code = f"http_{status}"
    said = f"HTTP {status}" + (f": {shown}" if shown else "")
    hint = retry_after(lower.get("retry-after"))
    if status == 429 or (status == 503 and hint is not None):
        return RateLimited(hint, said, code=code)
    if status == 408 or status >= 500:
        return TransientError(said, code=code)
    if 300 <= status < 400:
        location = lower.get("location", "")[:200]
        return PermanentError(
            f"{said}; redirected to {location!r}: publish to that URL instead", code=code
        )
    return PermanentError(said, code=code)


#: A header's name: an RFC 9110 token.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: Headers ``publish`` writes, or that frame the body: one given in ``headers=`` would be sent
#: beside it (names differing in case are different keys) or would misframe the request.
_OWN_HEADERS = frozenset(
    {
        "content-type",
        "content-length",
        "transfer-encoding",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    }
)


def _header_problem(name: Any, value: Any) -> str | None:
    """Why ``name: value`` cannot be one of a ``WebhookPublisher``'s ``headers``, or None."""
    if not isinstance(name, str) or not _TOKEN.fullmatch(name):
        return "a header's name is a token (letters, digits, !#$%&'*+-.^_`|~)"
    if name.lower() in _OWN_HEADERS:
        return "the publisher sends this header itself"
    if not isinstance(value, str):
        return f"a header's value is a str, not {type(value).__name__}"
    if not all(ord(c) < 256 for c in value):
        return "a header's value is latin-1 text"
    if any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in value):
        return "a header's value has no control characters (CR, LF, NUL, ...)"
    return None


class WebhookPublisher:
    """POST each event to ``url`` as CloudEvents JSON, signed with ``secret``.

    ``source``: the CloudEvents ``source`` (default ``/<aggregate type>``); ``timeout``:
    seconds to connect and, again, to wait for the answer; ``headers``: more headers to send
    (an ``Authorization``, say; not those it sends itself, nor ``Content-Length`` or
    ``Transfer-Encoding``). Needs ``urllib3`` (``pip install django-pgoutbox[webhooks]``).
    """

    def __init__(
        self,
        name: str,
        url: str,
        *,
        secret: str | bytes,
        source: str | None = None,
        timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        import urllib3

        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"WebhookPublisher {name!r}: url must be an http(s) URL, not {url!r}")
        key = webhook_secret(secret)
        if len(key) < MIN_SECRET_BYTES:
            raise ValueError(
                f"WebhookPublisher {name!r}: secret must be at least {MIN_SECRET_BYTES} bytes "
                f"(it has {len(key)}): a short key can be guessed"
            )
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT)
        ):
            raise ValueError(
                f"WebhookPublisher {name!r}: timeout must be seconds above 0 and at most "
                f"{MAX_TIMEOUT:g}, not {timeout!r}"
            )
        self.name, self.url, self.source = name, url, source
        self._key = key
        self._timeout = urllib3.Timeout(connect=timeout, read=timeout)
        self._read_budget = timeout  # for the body, after the headers came
        self._headers = dict(headers or {})
        for header, value in self._headers.items():
            problem = _header_problem(header, value)
            if problem:
                raise ValueError(f"WebhookPublisher {name!r}: headers: {header!r}: {problem}")
        # One pool per publisher, kept: its connections are reused across jobs and threads.
        self._pool = urllib3.PoolManager(retries=False, maxsize=8, block=False)
        self._pool.pool_classes_by_scheme = _pool_classes()

    def __repr__(self) -> str:
        return f"WebhookPublisher({self.name!r}, {self.url!r})"

    def body(self, event: OutboxEvent) -> bytes:
        return json.dumps(event.as_cloudevent(source=self.source), separators=(",", ":")).encode()

    def publish(self, event: OutboxEvent) -> None:
        import urllib3

        body = self.body(event)
        timestamp = int(time.time())
        headers = {
            **self._headers,
            "Content-Type": "application/cloudevents+json",
            "webhook-id": str(event.id),
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(self._key, str(event.id), timestamp, body),
        }
        try:
            response = self._pool.request(
                "POST",
                self.url,
                body=body,
                headers=headers,
                timeout=self._timeout,
                redirect=False,
                preload_content=False,
            )
        except urllib3.exceptions.HTTPError as error:
            # Connection refused or reset, a timeout, TLS: the other side may be back soon.
            raise TransientError(
                f"POST {self.url}: {type(error).__name__}: {error}"[:1000], code="http_unreachable"
            ) from None
        raw, whole = b"", False
        try:
            raw, whole = self._head_of_body(response, time.monotonic() + self._read_budget)
        finally:
            # A body left unread, or a protocol switched to (101): the connection is not reused.
            if not whole or response.status == 101:
                response.close()
            response.release_conn()
        shown = " ".join(raw[:BODY_SHOWN].decode("utf-8", "replace").split())
        problem = refusal(response.status, response.headers, shown)
        if problem is not None:
            raise problem

    @staticmethod
    def _head_of_body(response: Any, deadline: float) -> tuple[bytes, bool]:
        """The first ``BODY_READ`` bytes of the body, read until ``deadline`` at most (a body
        that drips a byte at a time cannot hold the job), and whether that was all of it."""
        import urllib3

        chunks: list[bytes] = []
        size = 0
        # Each read waits for the time left at most, not a whole read timeout more.
        sock = getattr(response.connection, "answer_socket", None)
        try:
            while size <= BODY_READ and (left := deadline - time.monotonic()) > 0:
                if sock is not None:
                    sock.settimeout(left)
                chunk = response.read1(1024, decode_content=False)  # one socket read at most
                if not chunk:
                    return b"".join(chunks), True
                chunks.append(chunk)
                size += len(chunk)
        except urllib3.exceptions.HTTPError:
            pass
        return b"".join(chunks), False


def _answer_within(connection: Any, getresponse: Callable[[], Any]) -> Any:
    """``getresponse()``, given up (``TimeoutError``) once the status line and headers have not
    all come within the connection's read timeout: a socket's timeout bounds each read, not a
    head sent a byte at a time (64 KiB of status line, 100 header lines of 64 KiB each)."""
    budget, sock = connection.timeout, connection.sock
    connection.answer_socket = sock
    if sock is None or isinstance(budget, bool) or not isinstance(budget, int | float):
        return getresponse()
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        with contextlib.suppress(OSError):
            # socket.socket's own: an SSLSocket's would drop its TLS state under the reader.
            socket.socket.shutdown(sock, socket.SHUT_RDWR)

    timer = threading.Timer(budget, expire)
    timer.daemon = True
    timer.start()
    try:
        response = getresponse()
    except Exception:
        if expired.is_set():
            raise TimeoutError(f"no whole answer within {budget:g}s") from None
        raise
    finally:
        timer.cancel()
        timer.join()
    if expired.is_set():  # http.client takes a head cut off by the end of the stream as whole
        raise TimeoutError(f"no whole answer within {budget:g}s")
    return response


@functools.cache
def _pool_classes() -> dict[str, Any]:
    """urllib3's connection pools, with connections that skip interim (1xx) answers and give up
    on an answer whose head has not all come within the read timeout (``_answer_within``)."""
    import http.client

    from urllib3 import connectionpool
    from urllib3.connection import HTTPConnection, HTTPSConnection

    class FinalResponse(http.client.HTTPResponse):
        """http.client skips a 100 Continue before the final answer, but returns any other 1xx
        (102 Processing, 103 Early Hints) as the answer, and its final answer is then read as
        the answer to the next request on the connection: each is skipped as a 100 is."""

        def _read_status(self) -> tuple[str, int, str]:
            version, status, reason = super()._read_status()  # type: ignore[misc]
            if 100 < status < 200 and status != 101:  # 101: the protocol changed, not skipped
                return version, http.client.CONTINUE, reason
            return version, status, reason

    class Connection(HTTPConnection):
        response_class = FinalResponse
        answer_socket: socket.socket | None = None

        def getresponse(self) -> Any:
            return _answer_within(self, super().getresponse)

    class SecureConnection(HTTPSConnection):
        response_class = FinalResponse
        answer_socket: socket.socket | None = None

        def getresponse(self) -> Any:
            return _answer_within(self, super().getresponse)

    # Named as urllib3's, which errors show: "HTTPConnectionPool(host=...): Read timed out."
    class HTTPConnectionPool(connectionpool.HTTPConnectionPool):
        ConnectionCls = Connection

    class HTTPSConnectionPool(connectionpool.HTTPSConnectionPool):
        ConnectionCls = SecureConnection

    return {"http": HTTPConnectionPool, "https": HTTPSConnectionPool}
