"""Hostile arguments of ``unique=``, ``on_conflict=``, ``debounce=`` and ``throttle=``: each is
refused with ``EnqueueError`` naming its field, through the cached check and the uncached one
(arguments that cannot be hashed), never with another exception."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest

from django_pgoutbox.errors import EnqueueError
from django_pgoutbox.uniqueness import Unique, resolve


def hostile(**fields: Any) -> Unique:
    """A ``Unique`` of fields as a caller without type checks may give them."""
    return Unique(**fields)


CASES: dict[str, tuple[dict[str, Any], str]] = {
    "a list in states": ({"unique": hostile(states=[["pending"]])}, "unique.states"),
    "a set in states": ({"unique": hostile(states=[{"pending"}])}, "unique.states"),
    "a dict in states": ({"unique": hostile(states=[{}])}, "unique.states"),
    "a number in states": ({"unique": hostile(states=("pending", 4))}, "unique.states"),
    "a list in by": ({"unique": hostile(by=[["payload"]])}, "unique.by"),
    "a list in keys": ({"unique": hostile(keys=[["a"]])}, "unique.keys"),
    "a list as key": ({"unique": hostile(key=["a"], by=["key"])}, "unique.key"),
    "unique=1": ({"unique": 1}, "unique"),
    "debounce=True": ({"debounce": True}, "debounce"),
    "a NaN debounce": ({"debounce": math.nan}, "debounce"),
    "a negative debounce": ({"debounce": -1}, "debounce"),
    "an infinite debounce": ({"debounce": math.inf}, "debounce"),
    "a throttle of 1.5 s": ({"throttle": 1.5}, "throttle"),
    "a NaN period": ({"unique": hostile(period=math.nan)}, "unique.period"),
    "a huge period": ({"unique": hostile(period=10**30)}, "unique.period"),
    "a million days": ({"unique": hostile(period=timedelta(days=10**6))}, "unique.period"),
    "a list as on_conflict": ({"unique": True, "on_conflict": ["replace"]}, "on_conflict"),
    "a text debounce": ({"debounce": "1"}, "debounce"),
}


@pytest.mark.parametrize(("arguments", "field"), list(CASES.values()), ids=list(CASES))
def test_refused_naming_the_field(arguments: dict[str, Any], field: str) -> None:
    given: dict[str, Any] = {"unique": None, "on_conflict": None, "debounce": None}
    given.update(arguments)
    with pytest.raises(EnqueueError) as caught:
        resolve(
            None,
            given["unique"],
            given["on_conflict"],
            given["debounce"],
            given.get("throttle"),
            EnqueueError,
        )
    assert caught.value.field == field
