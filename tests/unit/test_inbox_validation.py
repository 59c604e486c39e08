"""accept_message() refuses bad arguments before it touches a database, naming the argument."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from django_pgoutbox import InboxError, accept_message
from django_pgoutbox.errors import InvalidInput


@pytest.mark.parametrize(
    ("source", "message_id", "field", "message"),
    [
        ("", "evt_1", "source", "must be a non-empty string, not ''"),
        ("   ", "evt_1", "source", "must be a non-empty string"),
        (None, "evt_1", "source", "must be a non-empty string, not None"),
        (b"stripe", "evt_1", "source", "must be a non-empty string, not b'stripe'"),
        ("s" * 256, "evt_1", "source", "is 256 bytes in UTF-8, over the limit of 255 bytes"),
        ("é" * 128, "evt_1", "source", "is 256 bytes in UTF-8"),
        ("str\x00ipe", "evt_1", "source", "contains a NUL character"),
        ("stripe", "", "message_id", "must be a non-empty string, not ''"),
        ("stripe", "\t\n", "message_id", "must be a non-empty string"),
        ("stripe", None, "message_id", "must be a non-empty string, not None"),
        ("stripe", 123, "message_id", "must be a non-empty string, not 123"),
        ("stripe", uuid.UUID(int=1), "message_id", "must be a non-empty string, not UUID("),
        ("stripe", "evt\x00_1", "message_id", "contains a NUL character"),
        ("stripe", "evt_\ud800", "message_id", "unpaired surrogate"),
        ("stripe", "x" * 2049, "message_id", "is 2,049 bytes in UTF-8, over the limit of 2,048"),
        ("stripe", "é" * 1025, "message_id", "is 2,050 bytes in UTF-8"),
        ("stripe", "😀" * 513, "message_id", "is 2,052 bytes in UTF-8"),
    ],
)
def test_bad_arguments_are_named(source: Any, message_id: Any, field: str, message: str) -> None:
    with pytest.raises(InboxError) as raised:
        accept_message(source, message_id)
    assert raised.value.field == field
    assert message in raised.value.message
    assert str(raised.value).startswith(f"{field}: ")


@pytest.mark.parametrize("using", ["nope", 7, ""])
def test_a_database_not_in_databases(using: Any) -> None:
    with pytest.raises(InboxError, match=r"^using: no database .* in DATABASES"):
        accept_message("stripe", "evt_1", using=using)


def test_the_error_is_a_value_error_of_the_package() -> None:
    assert issubclass(InboxError, ValueError)
    assert issubclass(InboxError, InvalidInput)


def test_a_str_subclass_is_checked_as_the_text_it_sends() -> None:
    class Sneaky(str):
        def __len__(self) -> int:
            return 1

        def isascii(self) -> bool:
            return True

    with pytest.raises(InboxError, match="over the limit of 2,048"):
        accept_message("stripe", Sneaky("é" * 2000))
