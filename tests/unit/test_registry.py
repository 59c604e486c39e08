"""The @job decorator and its registry."""

from __future__ import annotations

import difflib
import warnings
from datetime import timedelta
from typing import Any

import pytest

from django_pgoutbox import job
from django_pgoutbox.conf import get_settings
from django_pgoutbox.errors import JobRegistrationError, UnknownJobTypeWarning
from django_pgoutbox.registry import check_undeclared_job_type, get_job, registered_jobs

pytestmark = pytest.mark.usefixtures("registry")


def test_bare_decorator_names_the_job_after_the_function() -> None:
    @job
    def ping(payload: dict[str, Any], ctx: Any) -> str:
        """Answer."""
        return "pong"

    assert (
        ping.name == "tests.unit.test_registry."
        "test_bare_decorator_names_the_job_after_the_function.<locals>.ping"
    )
    assert (ping.queue, ping.priority, ping.max_attempts) == ("default", 0, None)
    assert get_job(ping.name) is ping
    assert ping({}, None) == "pong"  # type: ignore[arg-type]
    assert ping.__doc__ == "Answer."


def test_options_are_kept() -> None:
    @job("x.y", queue="reports", max_attempts=3, priority=-2)
    def handler(payload: dict[str, Any], ctx: Any) -> None:
        pass

    assert registered_jobs()["x.y"] is handler
    assert (handler.queue, handler.max_attempts, handler.priority) == ("reports", 3, -2)
    assert (handler.timeout, handler.isolation) == (None, "thread")

    @job("x.z", timeout=timedelta(minutes=2), isolation="process")
    def other(payload: dict[str, Any], ctx: Any) -> None:
        pass

    assert (other.timeout, other.isolation) == (120.0, "process")


def test_demo_handlers_are_autodiscovered() -> None:
    assert get_job("demo.send_notification") is not None


def test_reregistering_the_same_function_is_allowed() -> None:
    def handler(payload: dict[str, Any], ctx: Any) -> None:
        pass

    job("x.same")(handler)
    job("x.same")(handler)
    assert get_job("x.same") is not None


def test_two_functions_cannot_share_a_name() -> None:
    @job("x.dup")
    def first(payload: dict[str, Any], ctx: Any) -> None:
        pass

    with pytest.raises(JobRegistrationError, match=r"'x\.dup' is already registered"):

        @job("x.dup")
        def second(payload: dict[str, Any], ctx: Any) -> None:
            pass


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"name": ""}, "name must be a non-empty string"),
        ({"name": "x\x00"}, r"name: contains a NUL character"),
        ({"queue": ""}, "queue must be a queue name"),
        ({"max_attempts": 0}, "max_attempts must be an integer from 1 to 2147483647"),
        ({"max_attempts": "3"}, "max_attempts must be an integer from 1 to 2147483647"),
        ({"priority": "high"}, "priority must be an integer from -2147483648 to 2147483647"),
        ({"timeout": 0}, "timeout must be a number of seconds > 0"),
        ({"timeout": "5"}, "timeout must be a number of seconds > 0"),
        ({"timeout": float("inf")}, "timeout must be a number of seconds > 0"),
        ({"isolation": "fork"}, "isolation must be 'thread' or 'process'"),
    ],
)
def test_bad_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(JobRegistrationError, match=message):

        @job(**options)
        def handler(payload: dict[str, Any], ctx: Any) -> None:
            pass


def test_handler_must_take_payload_and_ctx() -> None:
    with pytest.raises(JobRegistrationError, match=r"must accept \(payload, ctx\)"):

        @job("x.bad")  # type: ignore[arg-type]
        def only_payload(payload: dict[str, Any]) -> None:
            pass

    @job("x.kwargs")
    def flexible(*args: Any, **kwargs: Any) -> None:
        pass


def test_the_suggestion_for_an_undeclared_job_type_is_looked_for_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A service that enqueues another's job types without listing them in REMOTE_JOB_TYPES
    pays the search for a close name (which grows with the registry) once per name, not at each
    enqueue; a job type registered since is found all the same."""
    looked_for: list[str] = []
    search = difflib.get_close_matches

    def counted(word: str, *args: Any, **kwargs: Any) -> list[str]:
        looked_for.append(word)
        return search(word, *args, **kwargs)

    monkeypatch.setattr(difflib, "get_close_matches", counted)
    conf = get_settings()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnknownJobTypeWarning)
        for _ in range(3):
            check_undeclared_job_type("elsewhere.invoice", "job_type", conf)
    assert looked_for == ["elsewhere.invoice"]

    @job("elsewhere.invoices")
    def invoices(payload: dict[str, Any], ctx: Any) -> None:
        pass

    with pytest.warns(UnknownJobTypeWarning, match="did you mean 'elsewhere.invoices'"):
        check_undeclared_job_type("elsewhere.invoice", "job_type", conf)
