"""The @job decorator and its registry."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from django_pgoutbox import job
from django_pgoutbox.errors import JobRegistrationError
from django_pgoutbox.registry import get_job, registered_jobs

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
