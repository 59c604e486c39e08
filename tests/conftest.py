"""Fixtures shared by the suite. The database comes from testproject/database.py."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any, NoReturn

import psycopg
import pytest

from django_pgoutbox import db, outbox
from django_pgoutbox.registry import registered_jobs, restore_registry


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """With ``PGOUTBOX_TEST_SEED`` set (``./run stress`` sets one per round), run the tests in an
    order drawn from it: modules shuffled, then the classes of each, then the tests of each. The
    same seed gives the same order, so that a failure can be run again as it happened."""
    seed = os.environ.get("PGOUTBOX_TEST_SEED")
    if not seed:
        return
    rng = random.Random(int(seed))
    modules: dict[str, dict[str, list[pytest.Item]]] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        group = item.cls.__qualname__ if item.cls is not None else ""  # type: ignore[attr-defined]
        modules.setdefault(module, {}).setdefault(group, []).append(item)
    ordered = []
    for groups in rng.sample(list(modules.values()), len(modules)):
        for members in rng.sample(list(groups.values()), len(groups)):
            ordered += rng.sample(members, len(members))
    items[:] = ordered


#: The pytest process itself (a handler's ``os.fork()`` child is another).
_TEST_PROCESS = os.getpid()
_real_exit = os._exit


def _refuse_exit_in_the_test_process(status: int) -> NoReturn:
    """``os._exit`` in the pytest process would end the run with that status, the tests after
    it never run and nothing reported: ``runworkers`` called in-process exits so when daemon
    threads are alive at its end (a run that reported 0 after half its tests). It fails the
    test instead; forked children exit as they would."""
    if os.getpid() != _TEST_PROCESS:
        _real_exit(status)
    raise RuntimeError(f"os._exit({status}) called in the pytest process")


os._exit = _refuse_exit_in_the_test_process


@pytest.fixture
def registry() -> Iterator[None]:
    """Restore the job and subscriber registries after a test that registers its own."""
    saved_jobs = registered_jobs()
    saved_subscribers = {key: list(value) for key, value in outbox._subscribers.items()}
    yield
    restore_registry(saved_jobs)
    outbox._subscribers.clear()
    outbox._subscribers.update(saved_subscribers)


@pytest.fixture
def raw_connection_params() -> dict[str, Any]:
    """psycopg connection arguments for the test database, for a second, independent connection."""
    return db.raw_connection_params("default")


@pytest.fixture
def lane_conn(raw_connection_params: dict[str, Any]) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection of its own, as a worker's lane sends its statements on."""
    with psycopg.connect(**raw_connection_params, autocommit=True) as conn:
        yield conn


@pytest.fixture
def listener(raw_connection_params: dict[str, Any]) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection listening on the jobs channel."""
    with psycopg.connect(**raw_connection_params, autocommit=True) as conn:
        conn.execute("LISTEN pgoutbox_jobs")
        yield conn


@pytest.fixture
def outbox_listener(raw_connection_params: dict[str, Any]) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection listening on the outbox channel."""
    with psycopg.connect(**raw_connection_params, autocommit=True) as conn:
        conn.execute("LISTEN outbox_ready")
        yield conn


def drain_notifications(conn: psycopg.Connection[Any], timeout: float = 0.5) -> list[str]:
    """Payloads of the notifications that arrive within ``timeout`` seconds."""
    return [n.payload for n in conn.notifies(timeout=timeout, stop_after=None)]


from tests.processes import start_worker  # noqa: E402, F401 - a fixture for every test module


def claimed_job(job_type: str, **fields: Any) -> Any:
    """A ``ClaimedJob`` as a claim would return it: first attempt, default queue, empty payload."""
    import uuid

    from django.utils import timezone

    from django_pgoutbox.worker.execute import ClaimedJob

    values: dict[str, Any] = {
        "id": uuid.uuid4(),
        "payload": {},
        "attempt": 1,
        "max_attempts": 3,
        "organization_id": None,
        "queue": "default",
        "priority": 0,
        "created_at": timezone.now(),
        **fields,
    }
    return ClaimedJob(job_type=job_type, **values)


def drain(**options: Any) -> Any:
    """Run a burst worker (the jobs role, the default queue unless ``queues`` says) on a thread
    of this process until nothing it can run is due; return it. The suite's one way to drain
    in-process: the tests that use it are ``transaction=True``, as its threads see only
    committed jobs."""
    import threading

    from django_pgoutbox.worker import Worker

    worker = Worker(burst=True, **{"roles": ["jobs"], "queues": ["default"], **options})
    thread = threading.Thread(target=worker.run, name="test-drain")
    thread.start()
    thread.join(timeout=60 * float(os.environ.get("PGOUTBOX_TEST_TIME_SCALE", "1")))
    assert not thread.is_alive(), "the burst worker did not finish"
    return worker


@pytest.fixture
def lite() -> Iterator[str]:
    """A SQLite alias in DATABASES (to check that what needs PostgreSQL refuses it)."""
    from django.conf import settings
    from django.db import connections

    settings.DATABASES["lite"] = {
        **settings.DATABASES["default"],
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": ":memory:",
    }
    try:
        yield "lite"
    finally:
        connections["lite"].close()
        del connections["lite"]
        del settings.DATABASES["lite"]


@pytest.fixture
def traces(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """An OpenTelemetry SDK tracer provider, global for this test only; the in-memory exporter
    it returns keeps every span ended."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    yield exported
    provider.shutdown()
