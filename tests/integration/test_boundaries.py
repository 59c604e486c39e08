"""Every enqueue-side boundary is checked before anything is written.

A hostile value given to ``enqueue()``, ``enqueue_many()`` (its ``INSERT`` and its ``COPY`` path),
``publish()``, ``@job``, ``@subscriber``, a schedule or ``PGOUTBOX`` gets an error that names the
field and the limit; nothing is written; and the caller's transaction goes on (a later statement
in it succeeds). The limits are those of docs/reference/input-limits.md, each checked here on both
sides: the largest value that PostgreSQL must take is taken, and read back.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any

import pytest
from django.core.checks import run_checks
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_pgoutbox import EnqueueError, PublishError, enqueue, enqueue_many, job, publish
from django_pgoutbox.conf import parse_settings
from django_pgoutbox.copy_rows import COPY_CHUNK_SIZE, COPY_MIN_ROWS
from django_pgoutbox.errors import JobRegistrationError, SubscriberRegistrationError
from django_pgoutbox.models import Job, JobStatus, OutboxDelivery, OutboxEvent
from django_pgoutbox.outbox import subscriber
from django_pgoutbox.schedules import load_schedules
from django_pgoutbox.validation import (
    FIRST_MOMENT,
    LAST_MOMENT,
    MAX_IDEMPOTENCY_KEY_BYTES,
    MAX_NAME_BYTES,
)
from testproject.testjobs import tasks
from tests.conftest import drain

pytestmark = pytest.mark.django_db

MIB = 2**20
#: The default of both PGOUTBOX['MAX_PAYLOAD_BYTES'] and PGOUTBOX['MAX_RESULT_BYTES'].
DEFAULT_CAP = MIB


def incompressible(size: int, *, char_bytes: int = 1) -> str:
    """``size`` bytes of UTF-8 that PostgreSQL's compression cannot shrink: random characters
    of ``char_bytes`` bytes each (1: ASCII letters; 2: Latin and Greek; 3: CJK)."""
    rng = random.Random(size * 10 + char_bytes)
    first, count = {1: (0x21, 94), 2: (0x100, 0x700), 3: (0x4E00, 0x5000)}[char_bytes]
    text = "".join(chr(first + rng.randrange(count)) for _ in range(size // char_bytes))
    assert len(text.encode()) == size
    return text


def short_id(value: Any) -> str:
    """A test id for a hostile value: its type and size, not its text."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**64:
        return f"int-of-{value.bit_length()}-bits"
    if isinstance(value, str) and len(value) > 20:
        return f"{value[:10]}-{len(value)}-characters"
    try:
        text = repr(value)
    except ValueError:  # holds an int too long for repr()
        return f"{type(value).__name__}-holding-a-huge-int"
    return text if len(text) <= 40 else f"{text[:40]}..."


def assert_refused(
    call: Callable[[], Any], error: type[Exception], field: str, *said: str
) -> Exception:
    """``call()`` raises ``error`` naming ``field`` and saying each of ``said``; nothing of it is
    written, and the caller's transaction it ran in goes on: a job enqueued after it commits."""
    jobs, events = set(Job.objects.values_list("pk", flat=True)), OutboxEvent.objects.count()
    with transaction.atomic():
        with pytest.raises(error) as caught:
            call()
        after = enqueue("after.refusal", {})
    refused = caught.value
    assert getattr(refused, "field", None) == field, refused
    for phrase in said:
        assert phrase in str(refused), refused
    assert list(Job.objects.exclude(pk__in=jobs).values_list("pk", flat=True)) == [after.pk]
    assert OutboxEvent.objects.count() == events
    assert len(str(refused)) < 1000, "an error quotes a huge value whole"
    return refused


def one_job(**arguments: Any) -> Callable[[], Any]:
    values: dict[str, Any] = {"job_type": "a.b", "payload": {}, **arguments}
    return lambda: enqueue(values.pop("job_type"), values.pop("payload"), **values)


def one_event(**arguments: Any) -> Callable[[], Any]:
    values: dict[str, Any] = {
        "event_type": "x.happened",
        "aggregate_type": "x",
        "aggregate_id": uuid.uuid4(),
        "payload": {},
        **arguments,
    }
    return lambda: publish(values.pop("event_type"), **values)


def read_back(created: Job) -> Job:
    """The stored job, read as the admin and the workers read rows: every column loads."""
    stored = Job.objects.get(pk=created.pk)
    assert len(list(Job.objects.all())) == Job.objects.count()
    return stored


# -- the limits of each argument of enqueue() ---------------------------------------------------

#: field, hostile value, what the error must say (the limit).
HOSTILE_JOBS: list[tuple[str, Any, tuple[str, ...]]] = [
    ("idempotency_key", "k" * (MAX_IDEMPOTENCY_KEY_BYTES + 1), ("2,049 bytes", "2,048 bytes")),
    ("idempotency_key", os.urandom(1500).hex(), ("3,000 bytes", "2,048 bytes")),
    # 1,025 characters, 2,050 bytes: the limit is in bytes, as PostgreSQL's index counts them.
    ("idempotency_key", "é" * 1025, ("2,050 bytes", "2,048 bytes")),
    ("idempotency_key", "k" * 1_000_000, ("1,000,000 bytes", "2,048 bytes")),
    ("job_type", "t" * (MAX_NAME_BYTES + 1), ("256 bytes", "255 bytes")),
    ("job_type", "ü" * 128, ("256 bytes", "255 bytes")),
    ("job_type", "t" * 1_000_000, ("1,000,000 bytes", "255 bytes")),
    ("run_at", timedelta.max, ("0001-01-02 to 9999-12-30",)),
    ("run_at", timedelta.min, ("0001-01-02 to 9999-12-30",)),
    ("run_at", timedelta(days=3_000_000), ("0001-01-02 to 9999-12-30",)),
    ("run_at", datetime.max.replace(tzinfo=UTC), ("0001-01-02 to 9999-12-30",)),
    # Year 1 at +05:00 is year 0 in UTC: PostgreSQL takes it, Python cannot read it back.
    ("run_at", datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))), ("0001-01-02",)),
    ("run_at", LAST_MOMENT + timedelta(microseconds=1), ("9999-12-30",)),
    ("priority", 2**40, ("-2147483648 to 2147483647",)),
    ("priority", 2**31, ("-2147483648 to 2147483647",)),
    ("priority", -(2**31) - 1, ("-2147483648 to 2147483647",)),
    ("priority", True, ("must be an int",)),
    ("payload['x']", 10**5000, ("more than 4,300 digits",)),
    ("payload['a'][0]['n']", [{"n": -(10**4301)}], ("more than 4,300 digits",)),
    (
        "payload",
        "x" * DEFAULT_CAP,
        ("1,048,584 bytes of JSON", "1,048,576 bytes", "MAX_PAYLOAD_BYTES"),
    ),
    # Fewer characters than the cap, more bytes.
    ("payload", "é" * (DEFAULT_CAP // 2), ("1,048,584 bytes", "MAX_PAYLOAD_BYTES")),
    ("organization_id", 12, ("must be a UUID",)),
    ("organization_id", True, ("must be a UUID",)),
    ("organization_id", "o" * 1_000_000, ("must be a UUID",)),
    ("queue", "q" * 1_000_000, ("unknown queue",)),
    ("queue", ["default"], ("must be a string",)),
    ("using", ["default"], ("no database",)),
]


def _hostile_arguments(field: str, value: Any) -> dict[str, Any]:
    if field.startswith("payload"):
        key = field.partition("['")[2].partition("']")[0] or "x"
        return {"payload": {key: value}}
    return {field: value}


@pytest.mark.parametrize(("field", "value", "said"), HOSTILE_JOBS, ids=short_id)
def test_enqueue_refuses(field: str, value: Any, said: tuple[str, ...]) -> None:
    assert_refused(one_job(**_hostile_arguments(field, value)), EnqueueError, field, *said)


#: Two items go through INSERT; 64 or more without keys through COPY, where the last one comes
#: after a chunk of rows went to the server. using= is the call's, not an item's; a batch with a
#: key is inserted, never copied.
HOSTILE_ITEMS = [
    pytest.param(size, field, value, said, id=f"{size}-{field}-{short_id(value)}")
    for size in (2, COPY_MIN_ROWS, COPY_CHUNK_SIZE + 100)
    for field, value, said in HOSTILE_JOBS
    if field != "using" and (size == 2 or field != "idempotency_key")
]


@pytest.mark.parametrize(("size", "field", "value", "said"), HOSTILE_ITEMS)
def test_enqueue_many_refuses_on_either_path(
    size: int, field: str, value: Any, said: tuple[str, ...]
) -> None:
    """The bad item comes last: on the COPY path, a savepoint takes back what went before."""
    bad = {"job_type": "a.b", "payload": {}, **_hostile_arguments(field, value)}
    items = [{"job_type": "a.b", "payload": {"n": n}} for n in range(size - 1)] + [bad]
    assert_refused(lambda: enqueue_many(items), EnqueueError, f"items[{size - 1}].{field}", *said)


class TestLargestAccepted:
    """The largest values within each limit are written, and read back."""

    @pytest.mark.parametrize("char_bytes", [1, 2])
    @pytest.mark.parametrize("organization", [None, uuid.uuid4()])
    def test_the_longest_key_with_the_longest_job_type(
        self, char_bytes: int, organization: uuid.UUID | None
    ) -> None:
        """What the key's limit is derived from: the largest entry of ``jobs_idempotency_uq``,
        random (it does not compress), with or without an organization (its null bitmap)."""
        job_type = incompressible(MAX_NAME_BYTES - 1, char_bytes=char_bytes) + "t"
        key = incompressible(MAX_IDEMPOTENCY_KEY_BYTES, char_bytes=char_bytes)
        assert len(job_type.encode()) == MAX_NAME_BYTES
        created = enqueue(job_type, {}, idempotency_key=key, organization_id=organization)
        again = enqueue(job_type, {}, idempotency_key=key, organization_id=organization)
        assert again.pk == created.pk
        assert read_back(created).idempotency_key == key

    def test_the_first_and_last_moments(self) -> None:
        first = enqueue("a.b", {}, run_at=FIRST_MOMENT)
        last = enqueue("a.b", {}, run_at=LAST_MOMENT)
        assert (read_back(first).run_at, read_back(last).run_at) == (FIRST_MOMENT, LAST_MOMENT)
        far = enqueue("a.b", {}, run_at=timedelta(days=365 * 7000))
        assert read_back(far).run_at.year > 8000

    def test_the_int32_range(self) -> None:
        low = enqueue("a.b", {}, priority=-(2**31))
        high = enqueue("a.b", {}, priority=2**31 - 1)
        assert (read_back(low).priority, read_back(high).priority) == (-(2**31), 2**31 - 1)

    def test_an_integer_of_4300_digits(self) -> None:
        created = enqueue("a.b", {"n": 10**4300 - 1, "m": -(10**4300 - 1)})
        assert read_back(created).payload["n"] == 10**4300 - 1

    def test_a_payload_of_exactly_the_cap_in_multibyte_text(self) -> None:
        # {"x":"..."}: 8 characters around the text; "é" is 2 bytes.
        text = "é" * ((DEFAULT_CAP - 8) // 2)
        assert read_back(enqueue("a.b", {"x": text})).payload["x"] == text
        with pytest.raises(EnqueueError, match="1,048,577 bytes"):
            enqueue("a.b", {"x": text + "y"})


@pytest.mark.parametrize("keyed", [True, False])
def test_an_insert_carries_a_bounded_size_of_payloads(
    monkeypatch: pytest.MonkeyPatch, keyed: bool
) -> None:
    """A batch of payloads each within the cap could still make one INSERT statement larger
    than the 1 GB that PostgreSQL takes in one message (it closes the connection): 1,100 keyed
    payloads of 1 MB did. Statements are cut by the characters of their payloads too; here at
    1,000 characters, so that 10 payloads of 300 take 4 statements."""
    from django_pgoutbox import insert_rows

    monkeypatch.setattr(insert_rows, "ENQUEUE_CHUNK_CHARACTERS", 1000)
    items = [
        {"job_type": "a.b", "payload": {"t": "x" * 292}}  # {"t":"..."}: 300 characters
        | ({"idempotency_key": f"k{n}"} if keyed else {})
        for n in range(10)
    ]
    with CaptureQueriesContext(connection) as captured:
        jobs = enqueue_many(items)
    inserts = [q for q in captured.captured_queries if "INSERT INTO jobs" in q["sql"]]
    assert len(inserts) == 4  # 3 + 3 + 3 + 1 payloads
    assert [read_back(job).payload for job in jobs] == [item["payload"] for item in items]


class TestIntegerDigitsWhenPythonsLimitIsLifted:
    """A process that lifted ``sys.set_int_max_str_digits`` would write integers that every
    other process (and Django's JSONField) then fails to read: still refused."""

    @pytest.fixture(autouse=True)
    def lifted(self) -> Iterator[None]:
        import sys

        saved = sys.get_int_max_str_digits()
        sys.set_int_max_str_digits(0)
        yield
        sys.set_int_max_str_digits(saved)

    def test_enqueue(self) -> None:
        assert_refused(
            one_job(payload={"x": [1, 10**5000]}), EnqueueError, "payload['x'][1]", "4,300"
        )

    def test_publish(self) -> None:
        assert_refused(one_event(payload={"x": 10**5000}), PublishError, "payload['x']", "4,300")


class _Disguised(str):
    """Text whose own methods say it is short, plain ASCII, with no NUL."""

    def isascii(self) -> bool:
        return True

    def __len__(self) -> int:
        return 1

    def __contains__(self, item: object) -> bool:
        return False


class _OffsetOf30Hours(tzinfo):
    def utcoffset(self, moment: datetime | None) -> timedelta:
        return timedelta(hours=30)

    def dst(self, moment: datetime | None) -> None:
        return None

    def tzname(self, moment: datetime | None) -> str:
        return "+30:00"


class TestDisguisedValues:
    """Values are checked as psycopg and the JSON encoder will write them, not as their own
    methods describe them."""

    def test_a_str_subclass_is_checked_as_its_text(self) -> None:
        key = _Disguised("é" * 2000)
        assert_refused(one_job(idempotency_key=key), EnqueueError, "idempotency_key", "4,000")
        job_type = _Disguised("t" * 300)
        assert_refused(one_job(job_type=job_type), EnqueueError, "job_type", "300 bytes")
        text = _Disguised("a\x00b")
        assert_refused(one_job(payload={"s": text}), EnqueueError, "payload['s']", "NUL")
        assert_refused(one_job(payload={text: 1}), EnqueueError, "payload key 'a\\x00b'", "NUL")
        aggregate_type = _Disguised("a" * 300)
        refused = one_event(aggregate_type=aggregate_type)
        assert_refused(refused, PublishError, "aggregate_type", "300 bytes")

    def test_a_time_zone_without_a_valid_offset(self) -> None:
        moment = datetime(2030, 1, 1, tzinfo=_OffsetOf30Hours())
        assert_refused(one_job(run_at=moment), EnqueueError, "run_at", "no valid offset")
        assert_refused(
            one_event(available_at=moment), PublishError, "available_at", "no valid offset"
        )


@pytest.mark.django_db(transaction=True)
class TestAutocommit:
    """In autocommit (no transaction around the call), a refused enqueue leaves no row behind:
    the check comes before the statement, not from it."""

    @pytest.mark.parametrize(
        "run_at", [timedelta(days=3_000_000), timedelta.max, datetime.max.replace(tzinfo=UTC)]
    )
    def test_a_date_past_any_calendar(self, run_at: Any) -> None:
        assert connection.get_autocommit()
        with pytest.raises(EnqueueError, match="9999-12-30"):
            enqueue("a.b", {}, run_at=run_at)
        assert list(Job.objects.all()) == []

    def test_a_key_past_the_index(self) -> None:
        with pytest.raises(EnqueueError, match="2,048 bytes"):
            enqueue("a.b", {}, idempotency_key=os.urandom(1500).hex())
        assert list(Job.objects.all()) == []


# -- publish() ------------------------------------------------------------------------------------

HOSTILE_EVENTS: list[tuple[str, Any, tuple[str, ...]]] = [
    ("aggregate_type", "a" * (MAX_NAME_BYTES + 1), ("256 bytes", "255 bytes")),
    ("aggregate_type", "a" * 1_000_000, ("1,000,000 bytes", "255 bytes")),
    ("aggregate_type", "ö" * 128, ("256 bytes", "255 bytes")),
    ("event_type", "e" * 1_000_000, ("1,000,000 bytes", "255 bytes")),
    ("event_type", "e\udc80", ("unpaired surrogate",)),
    ("aggregate_id", "i" * 1_000_000, ("must be a UUID",)),
    ("aggregate_id", 7, ("must be a UUID",)),
    ("organization_id", 7, ("must be a UUID",)),
    ("schema_version", 2**31, ("from 1 to 2147483647",)),
    ("schema_version", 2**40, ("from 1 to 2147483647",)),
    ("available_at", datetime.max.replace(tzinfo=UTC), ("0001-01-02 to 9999-12-30",)),
    ("available_at", datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))), ("0001-01-02",)),
    ("payload['x']", 10**5000, ("more than 4,300 digits",)),
    ("payload", "x" * DEFAULT_CAP, ("1,048,576 bytes", "MAX_PAYLOAD_BYTES")),
    ("using", ["default"], ("no database",)),
]


@pytest.mark.parametrize(("field", "value", "said"), HOSTILE_EVENTS, ids=short_id)
def test_publish_refuses(field: str, value: Any, said: tuple[str, ...]) -> None:
    assert_refused(one_event(**_hostile_arguments(field, value)), PublishError, field, *said)


def test_publish_takes_the_largest_names_and_payload() -> None:
    aggregate_type = incompressible(MAX_NAME_BYTES - 1, char_bytes=1) + "a"
    event_type = incompressible(MAX_NAME_BYTES - 1, char_bytes=1) + "e"
    payload = {"x": "z" * (DEFAULT_CAP - 8)}
    event = publish(
        event_type, aggregate_type=aggregate_type, aggregate_id=uuid.uuid4(), payload=payload
    )
    stored = OutboxEvent.objects.get(pk=event.pk)
    assert (stored.aggregate_type, stored.event_type) == (aggregate_type, event_type)
    assert stored.payload == payload


def test_the_payload_cap_follows_the_setting(settings: Any) -> None:
    settings.PGOUTBOX = {**settings.PGOUTBOX, "MAX_PAYLOAD_BYTES": 100}
    assert_refused(
        one_job(payload={"x": "y" * 100}), EnqueueError, "payload", "108 bytes", "100 bytes"
    )
    assert_refused(
        one_event(payload={"x": "y" * 100}), PublishError, "payload", "108 bytes", "100 bytes"
    )
    enqueue("a.b", {"x": "y" * 92})  # exactly 100 bytes
    settings.PGOUTBOX = {**settings.PGOUTBOX, "MAX_PAYLOAD_BYTES": None}
    enqueue("a.b", {"x": "y" * (3 * MIB)})
    assert Job.objects.filter(job_type="a.b").count() == 2


# -- @job, @subscriber, schedules and settings: refused at declaration ---------------------------


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"priority": 2**40}, "priority must be an integer from -2147483648 to 2147483647"),
        ({"priority": -(2**31) - 1}, "priority must be an integer from -2147483648"),
        ({"priority": True}, "priority must be an integer"),
        ({"max_attempts": 2**40}, "max_attempts must be an integer from 1 to 2147483647"),
        ({"max_attempts": 2**31}, "max_attempts must be an integer from 1 to 2147483647"),
        ({"max_attempts": True}, "max_attempts must be an integer from 1"),
        ({"timeout": 1e300}, "timeout must be a number of seconds > 0 or a timedelta, at most"),
        ({"timeout": timedelta(days=366)}, "at most 31536000 seconds (365 days)"),
        ({"timeout": True}, "timeout must be a number of seconds"),
        ({"queue": "q" * 64}, "queue must be a queue name (1-63 letters"),
        ({"queue": "no spaces"}, "queue must be a queue name"),
        ({"name": "n" * (MAX_NAME_BYTES + 1)}, "256 bytes in UTF-8, over the limit of 255 bytes"),
        ({"name": "ñ" * 128}, "256 bytes in UTF-8, over the limit of 255 bytes"),
        ({"name": "n\udc80"}, "unpaired surrogate"),
    ],
    ids=short_id,
)
def test_job_declarations_are_refused(registry: None, options: dict[str, Any], said: str) -> None:
    options = dict(options)
    name = options.pop("name", "tests.declared")
    with pytest.raises(JobRegistrationError) as caught:

        @job(name, **options)  # type: ignore[untyped-decorator]  # options of any type
        def handler(payload: dict[str, Any], ctx: Any) -> None:
            pass

    assert said in str(caught.value)
    assert len(str(caught.value)) < 1000


def test_the_largest_job_declaration_is_enqueued_and_read_back(registry: None) -> None:
    name = "j" * MAX_NAME_BYTES

    @job(name, priority=2**31 - 1, max_attempts=2**31 - 1, timeout=timedelta(days=365))
    def handler(payload: dict[str, Any], ctx: Any) -> None:
        pass

    created = enqueue(name, {})
    many = enqueue_many([{"job_type": name, "payload": {}}] * COPY_MIN_ROWS)
    stored = read_back(created)
    assert (stored.priority, stored.max_attempts) == (2**31 - 1, 2**31 - 1)
    assert read_back(many[0]).priority == 2**31 - 1


@pytest.mark.parametrize(
    ("event_types", "versions", "said"),
    [
        (("e" * (MAX_NAME_BYTES + 1),), (1,), "256 bytes in UTF-8, over the limit of 255"),
        (("é" * 128,), (1,), "256 bytes in UTF-8, over the limit of 255"),
        (("e\x00",), (1,), "NUL"),
        (("tests.e",), (2**31,), "versions must be integers from 1 to 2147483647"),
        (("tests.e",), (True,), "versions must be integers from 1"),
        (("tests.e",), 5, "versions must be integers from 1"),
    ],
    ids=short_id,
)
def test_subscriber_declarations_are_refused(
    registry: None, event_types: tuple[str, ...], versions: Any, said: str
) -> None:
    with pytest.raises(SubscriberRegistrationError) as caught:

        @subscriber(*event_types, versions=versions)
        def projection(event: OutboxEvent) -> None:
            pass

    assert said in str(caught.value)
    assert len(str(caught.value)) < 1000


@pytest.mark.parametrize(
    ("schedule", "said"),
    [
        ({"PRIORITY": 2**40}, "PRIORITY: 1099511627776 is outside the 32-bit integer range"),
        ({"PAYLOAD": {"x": "y" * DEFAULT_CAP}}, "PAYLOAD: is 1,048,584 bytes of JSON"),
        ({"PAYLOAD": {"n": 10**5000}}, "PAYLOAD['n']: is an integer of more than 4,300 digits"),
    ],
    ids=short_id,
)
def test_schedules_are_refused_naming_the_key(schedule: dict[str, Any], said: str) -> None:
    schedules = {"tests.hostile": {"JOB": "tests.noop", "EVERY": 60, **schedule}}
    with override_settings(PGOUTBOX={"SCHEDULES": schedules}):
        _, problems = load_schedules()
        errors = [e for e in run_checks() if e.id == "pgoutbox.E007"]
    assert [p.name for p in problems] == ["tests.hostile"]
    assert said in problems[0].message, problems[0].message
    assert len(errors) == 1
    assert len(str(problems[0])) < 1000


def test_a_schedule_name_is_a_name() -> None:
    long_name = "s" * (MAX_NAME_BYTES + 1)
    schedules = {long_name: {"JOB": "tests.noop", "EVERY": 60}}
    with override_settings(PGOUTBOX={"SCHEDULES": schedules}):
        _, problems = load_schedules()
    assert "the name: is 256 bytes in UTF-8, over the limit of 255 bytes" in str(problems[0])
    assert len(str(problems[0])) < 1000
    longest = "s" * MAX_NAME_BYTES
    with override_settings(PGOUTBOX={"SCHEDULES": {longest: {"JOB": "tests.noop", "EVERY": 60}}}):
        loaded, problems = load_schedules()
    assert problems == []
    from django_pgoutbox.scheduler import run_now

    key = read_back(run_now(loaded[longest])).idempotency_key
    assert key is not None
    assert key.startswith(f"schedule:{longest}:manual:")


@pytest.mark.parametrize("key", ["MAX_PAYLOAD_BYTES", "MAX_RESULT_BYTES"])
@pytest.mark.parametrize("value", [0, 1, -1, True, 1.5, "1MB", 2**28, 2**40])
def test_the_byte_caps_are_checked_like_every_setting(key: str, value: Any) -> None:
    _, problems = parse_settings({key: value})
    assert [(p.check_id, p.key) for p in problems] == [("pgoutbox.E004", f"PGOUTBOX[{key!r}]")]
    assert "from 2 to 268,435,455" in problems[0].message
    assert "or None" in problems[0].message


@pytest.mark.parametrize("key", ["MAX_PAYLOAD_BYTES", "MAX_RESULT_BYTES"])
def test_the_byte_caps_take_none_and_their_ends(key: str) -> None:
    for value, parsed_as in [(None, None), (2, 2), (2**28 - 1, 2**28 - 1)]:
        parsed, problems = parse_settings({key: value})
        assert problems == []
        assert getattr(parsed, key.lower()) == parsed_as
    defaults, _ = parse_settings(None)
    assert getattr(defaults, key.lower()) == DEFAULT_CAP


def test_max_attempts_of_2_to_the_40_is_refused_by_check() -> None:
    with override_settings(PGOUTBOX={"MAX_ATTEMPTS": 2**40}):
        errors = [e for e in run_checks() if e.id == "pgoutbox.E004"]
    assert [str(e.msg) for e in errors] == [
        "PGOUTBOX['MAX_ATTEMPTS'] must be an integer <= 2147483647, not 1099511627776."
    ]


# -- django.tasks ---------------------------------------------------------------------------------


def test_task_arguments_over_the_payload_cap_are_an_invalid_task() -> None:
    from django_pgoutbox._tasks import InvalidTask

    with transaction.atomic():
        with pytest.raises(InvalidTask, match=r"payload: is 1,048,6\d\d bytes of JSON"):
            tasks.add.enqueue("x" * DEFAULT_CAP, 1)
        enqueue("after.refusal", {})
    assert list(Job.objects.values_list("job_type", flat=True)) == ["after.refusal"]


# -- results --------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
class TestResults:
    """A handler's result over ``MAX_RESULT_BYTES`` ends its job dead (``result_too_large``),
    run in-process here; tests/processes/reliability/test_poison_values.py runs it in a real
    worker beside innocent jobs."""

    @pytest.mark.parametrize(
        ("payload", "size"),
        [
            ({"characters": DEFAULT_CAP}, "1,048,587 bytes"),
            # Fewer characters than the cap, more bytes.
            ({"characters": DEFAULT_CAP // 3, "char": "€"}, "1,048,586 bytes"),
        ],
    )
    def test_a_result_over_the_cap_is_dead_and_not_stored(
        self, payload: dict[str, Any], size: str
    ) -> None:
        big, innocent = enqueue_many(
            [
                {"job_type": "tests.poison_big_result", "payload": payload},
                {"job_type": "tests.poison_big_result", "payload": {"characters": 10}},
            ]
        )
        drain()
        big, innocent = Job.objects.get(pk=big.pk), Job.objects.get(pk=innocent.pk)
        assert (innocent.status, innocent.result) == (JobStatus.COMPLETED, {"text": "x" * 10})
        assert (big.status, big.last_error_code, big.result) == (
            JobStatus.DEAD,
            "result_too_large",
            None,
        )
        assert big.attempts == 1
        assert size in (big.last_error_summary or "")
        assert "1,048,576 bytes (PGOUTBOX['MAX_RESULT_BYTES'])" in (big.last_error_summary or "")

    def test_a_result_of_exactly_the_cap_is_stored(self) -> None:
        # {"text":"..."}: 11 characters around the text.
        exact = enqueue("tests.poison_big_result", {"characters": DEFAULT_CAP - 11})
        drain()
        stored = Job.objects.get(pk=exact.pk)
        assert stored.status == JobStatus.COMPLETED
        assert stored.result == {"text": "x" * (DEFAULT_CAP - 11)}

    def test_the_result_cap_follows_the_setting(self, settings: Any) -> None:
        settings.PGOUTBOX = {**settings.PGOUTBOX, "MAX_RESULT_BYTES": None}
        unlimited = enqueue("tests.poison_big_result", {"characters": 2 * DEFAULT_CAP})
        drain()
        assert Job.objects.get(pk=unlimited.pk).status == JobStatus.COMPLETED
        settings.PGOUTBOX = {**settings.PGOUTBOX, "MAX_RESULT_BYTES": 100}
        small = enqueue("tests.poison_big_result", {"characters": 90})
        drain()
        stored = Job.objects.get(pk=small.pk)
        assert (stored.status, stored.last_error_code) == (JobStatus.DEAD, "result_too_large")
        assert "101 bytes of JSON, over the limit of 100 bytes" in (stored.last_error_summary or "")

    def test_a_task_result_over_the_cap_fails_the_task(self) -> None:
        from django_pgoutbox._tasks import TaskResultStatus

        result = tasks.returns_text.enqueue(DEFAULT_CAP)
        fine = tasks.returns_text.enqueue(10)
        drain()
        fetched = tasks.returns_text.get_result(result.id)
        assert fetched.status == TaskResultStatus.FAILED
        assert fetched.errors[0].exception_class_path == "result_too_large"
        assert "MAX_RESULT_BYTES" in fetched.errors[0].traceback
        assert tasks.returns_text.get_result(fine.id).return_value == "x" * 10


# -- a subscriber's enqueue (the relay's deferred jobs) -------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_subscriber_enqueuing_past_a_limit_fails_its_delivery_only(registry: None) -> None:
    from django_pgoutbox.conf import get_settings
    from django_pgoutbox.worker.relay import Relay

    @subscriber("tests.hostile_projection")
    def projection(event: OutboxEvent) -> None:
        enqueue("tests.noop", {"event": str(event.id), **event.payload})

    with transaction.atomic():
        good = [
            publish(
                "tests.hostile_projection",
                aggregate_type="x",
                aggregate_id=uuid.uuid4(),
                payload={"n": n},
            )
            for n in range(3)
        ]
        bad = publish(
            "tests.hostile_projection",
            aggregate_type="x",
            aggregate_id=uuid.uuid4(),
            payload={"big": "y" * 3000},  # within the default cap of events
        )
    with override_settings(PGOUTBOX={"MAX_PAYLOAD_BYTES": 3000, "OUTBOX": {"MAX_ATTEMPTS": 1}}):
        conf = get_settings()
        Relay(conf.outbox, relay_id="r", using="default", policy=conf.retry, burst=True).run()
    assert Job.objects.count() == 3
    stored = OutboxDelivery.objects.get(event_id=bad.pk)  # its subscriber's delivery alone
    assert (stored.subscriber, stored.attempts) == (projection.name, 1)
    assert stored.dead_at is not None
    assert stored.last_error_code == "EnqueueError"
    assert "over the limit of 3,000 bytes" in (stored.last_error or "")
    assert all(e.processed_at for e in OutboxEvent.objects.all())
    assert not OutboxDelivery.objects.filter(event_id__in=[g.pk for g in good]).exists()
