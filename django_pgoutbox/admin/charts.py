"""The overview's charts: inline SVG drawn on the server from ``queue_minutes``, no JavaScript.

Each chart is one or two lines over the window's minutes, a minute with no row a gap. Colours
are the admin's own CSS variables, so that the charts follow its light and dark themes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from django_pgoutbox.queue_minutes import WINDOWS, Minute

WIDTH = 240
HEIGHT = 56
#: Room above the lines for the largest value's label.
TOP = 12


@dataclass(frozen=True)
class Series:
    label: str
    values: Sequence[float | None]
    #: A CSS colour: one of the admin's variables, with a fallback for older admins.
    colour: str


COMPLETED = "var(--link-fg, #417893)"
FAILED = "var(--error-fg, #ba2121)"
QUIET = "var(--body-quiet-color, #666)"
LINE = "var(--hairline-color, #e8e8e8)"


#: The window the overview shows unless ``?hours=`` names another of ``WINDOWS``.
DEFAULT_HOURS = 3


def window(value: str | None) -> int:
    """The chart window that ``?hours=`` asks for: one of ``WINDOWS``, else the default."""
    try:
        hours = int(value or DEFAULT_HOURS)
    except ValueError:
        return DEFAULT_HOURS
    return hours if hours in WINDOWS else DEFAULT_HOURS


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def _path(values: Sequence[float | None], top: float) -> str:
    """The SVG path of ``values`` scaled to ``top``: a new segment after each gap, and a dot
    for a minute alone between gaps."""
    count = len(values)
    step = WIDTH / max(1, count - 1)
    parts: list[str] = []
    run = 0  # points in the segment being drawn
    for index, value in enumerate([*values, None]):
        if value is None:
            if run == 1:
                parts.append("l0.5 0")  # a lone point: a dot, with the round line caps
            run = 0
            continue
        x = index * step
        y = TOP + (HEIGHT - TOP) * (1 - (value / top if top else 0))
        parts.append(f"{'L' if run else 'M'}{x:.1f} {y:.1f}")
        run += 1
    return " ".join(parts)


def chart(title: str, series: Sequence[Series], hours: int) -> SafeString:
    """One chart: ``series`` over the window, with the largest value and the last one."""
    known = [value for each in series for value in each.values if value is not None]
    top = max(known, default=0.0)
    summary = "; ".join(
        f"{each.label}: "
        + (
            "no data"
            if not any(v is not None for v in each.values)
            else f"max {_number(max(v for v in each.values if v is not None))}, "
            f"last {_number(next(v for v in reversed(each.values) if v is not None))}"
        )
        for each in series
    )
    lines = format_html_join(
        "",
        '<path d="{}" fill="none" stroke="{}" stroke-width="1.5" stroke-linecap="round">'
        "<title>{}</title></path>",
        ((_path(each.values, top), each.colour, each.label) for each in series if known),
    )
    legend = format_html_join(
        " ",
        '<tspan fill="{}">{}</tspan>',
        ((each.colour, each.label) for each in series),
    )
    return format_html(
        '<svg class="pgoutbox-chart" role="img" width="{w}" height="{h}" '
        'viewBox="0 0 {w} {h}" xmlns="http://www.w3.org/2000/svg">'
        "<title>{title} over the last {hours} h: {summary}</title>"
        '<line x1="0" y1="{h}" x2="{w}" y2="{h}" stroke="{line}"/>'
        '<text x="0" y="9" font-size="9" fill="{quiet}">{top}</text>'
        '<text x="{w}" y="9" font-size="9" text-anchor="end">{legend}</text>'
        "{lines}</svg>",
        w=WIDTH,
        h=HEIGHT,
        title=title,
        hours=hours,
        summary=summary,
        line=LINE,
        quiet=QUIET,
        top=_number(top) if known else "no data yet",
        legend=legend,
        lines=lines,
    )


def queue_charts(minutes: Sequence[Minute], hours: int) -> list[SafeString]:
    """A queue's three charts: outcomes per minute, backlog, oldest due job's wait."""
    return [
        chart(
            "Jobs per minute",
            [
                Series("completed", [m.completed for m in minutes], COMPLETED),
                Series("failed", [m.failed for m in minutes], FAILED),
            ],
            hours,
        ),
        chart("Backlog", [Series("waiting", [m.backlog for m in minutes], QUIET)], hours),
        chart(
            "Oldest due (s)",
            [Series("seconds", [m.oldest_pending_age for m in minutes], QUIET)],
            hours,
        ),
    ]
