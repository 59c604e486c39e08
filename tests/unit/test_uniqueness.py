"""The policy of a unique job: ``unique``, ``on_conflict``, ``debounce`` and ``throttle`` checked
together, each error naming its field, and the key made of what the policy compares."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from django_pgoutbox.errors import EnqueueError
from django_pgoutbox.uniqueness import (
    ALL_STATES,
    STATE_BITS,
    Unique,
    UniquePolicy,
    policy,
    states_named,
)


def checked(
    unique: Any = None, on_conflict: Any = None, debounce: Any = None, throttle: Any = None
) -> UniquePolicy | None:
    return policy(unique, on_conflict, debounce, throttle, EnqueueError)


def refused(**arguments: Any) -> EnqueueError:
    with pytest.raises(EnqueueError) as caught:
        checked(**arguments)
    return caught.value


def bits(*names: str) -> int:
    return sum(STATE_BITS[name] for name in names)


class TestDefaults:
    def test_nothing_asked_is_not_unique(self) -> None:
        assert checked() is None
        assert checked(unique=False) is None
        assert checked(unique=False, debounce=timedelta(seconds=5)) is None

    def test_unique_true_compares_organization_queue_and_payload_while_unfinished(self) -> None:
        found = checked(unique=True)
        assert found is not None
        assert found.by == ("organization", "queue", "payload")
        assert found.states == bits("pending", "leased", "retrying")
        assert (found.period, found.on_conflict, found.debounce, found.throttle) == (
            None,
            "keep",
            None,
            False,
        )

    def test_a_period_holds_the_key_once_completed_too(self) -> None:
        found = checked(unique=Unique(period=timedelta(hours=1)))
        assert found is not None
        assert found.period == 3600
        assert found.states == bits("pending", "leased", "retrying", "completed")

    def test_a_key_replaces_the_payload_in_the_default_fields(self) -> None:
        found = checked(unique=Unique(key="account:7"))
        assert found is not None
        assert found.by == ("organization", "queue", "key")

    def test_debounce_holds_the_key_while_pending_only(self) -> None:
        found = checked(debounce=timedelta(seconds=2.5))
        assert found is not None
        assert (found.states, found.debounce, found.on_conflict) == (bits("pending"), 2.5, "keep")

    def test_throttle_holds_the_key_in_every_state_within_its_window(self) -> None:
        found = checked(throttle=timedelta(minutes=1))
        assert found is not None
        assert (found.states, found.period, found.throttle) == (ALL_STATES, 60, True)


class TestRefused:
    @pytest.mark.parametrize(
        ("arguments", "field", "says"),
        [
            ({"unique": "yes"}, "unique", "must be True, False, None or a Unique"),
            ({"unique": True, "on_conflict": "update"}, "on_conflict", "'keep' or 'replace'"),
            ({"on_conflict": "replace"}, "on_conflict", "needs unique="),
            ({"unique": Unique(by=("payload", "tenant"))}, "unique.by", "unknown field 'tenant'"),
            ({"unique": Unique(by="payload")}, "unique.by", "must be a list"),
            ({"unique": Unique(by=("queue", "queue"))}, "unique.by", "names a field twice"),
            ({"unique": Unique(keys=())}, "unique.keys", "non-empty list"),
            ({"unique": Unique(keys="account")}, "unique.keys", "non-empty list"),
            ({"unique": Unique(keys=("",))}, "unique.keys", "non-empty strings"),
            ({"unique": Unique(by=("queue",), keys=("a",))}, "unique.keys", "add 'payload'"),
            ({"unique": Unique(by=("key",))}, "unique.key", "is required"),
            ({"unique": Unique(by=("queue",), key="k")}, "unique.key", "has no 'key'"),
            ({"unique": Unique(key="")}, "unique.key", "non-empty string"),
            ({"unique": Unique(key="k" * 2049)}, "unique.key", "longer than 2048"),
            ({"unique": Unique(states=())}, "unique.states", "non-empty list"),
            ({"unique": Unique(states=("running",))}, "unique.states", "unknown state"),
            ({"unique": Unique(states=("waiting",))}, "unique.states", "unknown state"),
            ({"unique": Unique(states=("leased",))}, "unique.states", "must hold 'pending'"),
            (
                {"unique": Unique(states=("pending", "retrying"))},
                "unique.states",
                "lacks 'leased'",
            ),
            (
                {"unique": Unique(states=("pending", "completed"))},
                "unique.states",
                "lacks 'leased', 'retrying'",
            ),
            (
                {"unique": Unique(states=("pending", "leased", "retrying", "cancelled"))},
                "unique.states",
                "has 'cancelled' but not 'dead'",
            ),
            ({"unique": Unique(period=timedelta(seconds=1.5))}, "unique.period", "whole number"),
            ({"unique": Unique(period=timedelta(0))}, "unique.period", "whole number"),
            ({"throttle": 0.5}, "throttle", "whole number"),
            ({"throttle": True}, "throttle", "timedelta or a number"),
            ({"debounce": -1}, "debounce", "from 0 to"),
            ({"debounce": float("nan")}, "debounce", "from 0 to"),
            ({"debounce": "5s"}, "debounce", "timedelta or a number"),
            ({"debounce": 1, "throttle": 60}, "debounce", "cannot go with throttle"),
            (
                {"unique": Unique(states=("pending",)), "debounce": 1},
                "unique.states",
                "cannot go with debounce",
            ),
            (
                {"unique": Unique(period=timedelta(hours=1)), "throttle": 60},
                "unique.period",
                "cannot go with throttle",
            ),
        ],
    )
    def test_names_the_field(self, arguments: dict[str, Any], field: str, says: str) -> None:
        error = refused(**arguments)
        assert error.field == field
        assert says in error.message

    def test_the_allowed_shapes_of_states(self) -> None:
        for states in (
            ("pending",),
            ("pending", "leased", "retrying"),
            ("retrying", "leased", "pending", "completed", "dead", "cancelled"),
            ("pending", "leased", "retrying", "dead"),
        ):
            found = checked(unique=Unique(states=states))
            assert found is not None
            assert states_named(found.states) == [s for s in STATE_BITS if s in states]


class TestKey:
    def key(self, spec: Unique, **row: Any) -> uuid.UUID:
        found = checked(unique=spec)
        assert found is not None
        values = {"job_type": "t", "organization_id": None, "queue": "q", "payload": {}, **row}
        return found.row_key(
            values["job_type"], values["organization_id"], values["queue"], values["payload"]
        )

    def test_the_job_type_is_always_in_it(self) -> None:
        assert self.key(Unique(), job_type="a") != self.key(Unique(), job_type="b")
        assert self.key(Unique(by=())) == self.key(Unique(by=()), queue="other")

    def test_only_the_fields_named(self) -> None:
        org = uuid.uuid4()
        assert self.key(Unique()) != self.key(Unique(), organization_id=org)
        assert self.key(Unique(by=("payload",))) == self.key(
            Unique(by=("payload",)), organization_id=org, queue="other"
        )
        assert self.key(Unique(), payload={"a": 1}) != self.key(Unique(), payload={"a": 2})

    def test_payload_keys_compare_only_those_parts_in_any_order(self) -> None:
        spec = Unique(keys=("account", "kind"))
        same = self.key(spec, payload={"account": 1, "kind": "x", "note": "a"})
        assert same == self.key(spec, payload={"kind": "x", "note": "b", "account": 1})
        assert same != self.key(spec, payload={"account": 2, "kind": "x"})

    def test_a_missing_payload_key_differs_from_null(self) -> None:
        spec = Unique(keys=("account",))
        assert self.key(spec, payload={}) != self.key(spec, payload={"account": None})

    def test_a_payload_in_another_key_order_is_the_same(self) -> None:
        assert self.key(Unique(), payload={"a": 1, "b": {"c": 2, "d": 3}}) == self.key(
            Unique(), payload={"b": {"d": 3, "c": 2}, "a": 1}
        )

    def test_the_order_of_by_does_not_matter(self) -> None:
        assert self.key(Unique(by=("queue", "organization", "key"), key="k")) == self.key(
            Unique(by=("key", "organization", "queue"), key="k")
        )

    def test_it_is_128_bits(self) -> None:
        assert isinstance(self.key(Unique(key="k" * 2048)), uuid.UUID)


class TestResolve:
    def test_a_cached_policy_still_refuses_one_for_true(self) -> None:
        from django_pgoutbox.uniqueness import resolve

        assert resolve(None, True, None, None, None, EnqueueError) is not None
        with pytest.raises(EnqueueError) as caught:
            resolve(None, 1, None, None, None, EnqueueError)  # type: ignore[arg-type]
        assert caught.value.field == "unique"

    def test_an_unhashable_unique_is_checked_each_time(self) -> None:
        from django_pgoutbox.uniqueness import resolve

        found = resolve(None, Unique(keys=["a"]), None, None, None, EnqueueError)
        assert found is not None
        assert found.keys == ("a",)
        with pytest.raises(EnqueueError, match="unknown state"):
            resolve(None, Unique(states=["nope"]), None, None, None, EnqueueError)

    def test_declared_and_given_arguments_combine(self) -> None:
        from django_pgoutbox.uniqueness import Declared, resolve

        declared = Declared(Unique(keys=("a",)), "replace", None, None)
        found = resolve(declared, None, None, 5, None, EnqueueError)
        assert found is not None
        assert (found.keys, found.on_conflict, found.debounce) == (("a",), "replace", 5.0)
        assert resolve(declared, False, None, None, None, EnqueueError) is None


def test_two_policies_comparing_different_things_do_not_meet() -> None:
    whole, part = checked(unique=Unique()), checked(unique=Unique(keys=("a",)))
    assert whole is not None
    assert part is not None
    assert whole.row_key("t", None, "q", {"a": 1}) != part.row_key("t", None, "q", {"a": 1})
