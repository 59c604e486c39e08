"""The management commands' text tables: no database."""

from __future__ import annotations

from django_pgoutbox.management.table import Column, cut, render


def test_a_header_row_and_columns_as_wide_as_their_widest_cell() -> None:
    lines = render(
        [Column("queue"), Column("pending", ">")],
        [("default", 3), ("a_queue_with_a_long_name", 12345)],
    )
    assert lines == [
        "queue                     pending",
        "default                         3",
        "a_queue_with_a_long_name    12345",
    ]


def test_text_past_its_column_limit_ends_in_an_ellipsis() -> None:
    lines = render([Column("id"), Column("error", max_width=10)], [(1, "x" * 30), (2, "short")])
    assert lines == ["id  error", "1   xxxxxxxxx…", "2   short"]
    assert len(lines[1].split()[-1]) == 10


def test_a_cell_is_one_line() -> None:
    (_, row) = render([Column("error")], [("Traceback:\n  line 1\tand\r\nmore",)])
    assert row == "Traceback: line 1 and more"


def test_cut_keeps_what_fits() -> None:
    assert cut("abc", 3) == "abc"
    assert cut("abcd", 3) == "ab…"


def test_wide_characters_keep_the_columns_aligned() -> None:
    """A CJK character takes two columns of a terminal, a combining accent none."""
    lines = render(
        [Column("job type"), Column("dead", ">")],
        [("メール.送信", 1), ("cafe\u0301.order", 22), ("plain", 333)],
    )
    assert lines == [
        "job type     dead",
        "メール.送信     1",
        "cafe\u0301.order     22",
        "plain         333",
    ]


def test_wide_characters_are_cut_to_the_columns_they_take() -> None:
    (_, row) = render([Column("error", max_width=6)], [("送信送信送信",)])
    assert row == "送信…"
    assert cut("送信", 4) == "送信"
    assert cut("送信送信", 4) == "送…"


def test_control_characters_are_shown_escaped_not_sent_to_the_terminal() -> None:
    """An error message is what a handler raised: an escape sequence in it must not clear the
    operator's screen or reverse the text that follows."""
    (_, row) = render([Column("error")], [("boom\x1b[2J\x07 \u202egnp.exe",)])
    assert row == "boom\\x1b[2J\\x07 \\u202egnp.exe"
