"""A workflow's steps as a graph: a layered layout and its inline SVG, drawn on the server.

Each step's layer is the longest path to it from a step that waits for none (a root); the
layers are columns, left to right, and one barycenter pass down and one up order each column so
that fewer edges cross. Steps that wait for each other in a circle (only a hand-written edge can
make one: ``enqueue()`` refuses them) get no layer from that walk and are drawn in a last column
of their own. Pure functions of the steps and edges given: no database, no request.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

K = TypeVar("K", bound=Hashable)

NODE_WIDTH = 210
NODE_HEIGHT = 66
COLUMN_GAP = 70
ROW_GAP = 14
MARGIN = 8
#: The most characters of a step's name and of its job type that a box shows (its title, a
#: tooltip, has them whole).
NAME_CHARS = 30

#: A status's colour, and the word the box says (a colour is never the only sign of it).
STATUS_STYLES: Mapping[str, tuple[str, str]] = {
    "waiting": ("#8a8a8a", "waiting"),
    "pending": ("#417893", "pending"),
    "leased": ("#1f6feb", "running"),
    "retrying": ("#c77c02", "retrying"),
    "completed": ("#2e7d32", "completed"),
    "dead": ("#ba2121", "dead"),
    "cancelled": ("#6b6b6b", "cancelled"),
}
#: Statuses drawn with a dashed border: not run, or never to run.
DASHED = frozenset({"waiting", "cancelled"})
EDGE = "var(--body-quiet-color, #999)"
TEXT = "var(--body-fg, #333)"
QUIET = "var(--body-quiet-color, #666)"


@dataclass(frozen=True)
class Layers(Generic[K]):
    """Each step's layer, and the steps that wait for each other in a circle (in the last
    layer, ``circular``)."""

    layer_of: dict[K, int]
    circular: frozenset[K]

    @property
    def depth(self) -> int:
        return max(self.layer_of.values(), default=-1) + 1


def layers(steps: Sequence[K], edges: Iterable[tuple[K, K]]) -> Layers[K]:
    """The longest path from a root to each step (Kahn's walk: each edge is followed once,
    whatever the graph, so a circle cannot make it loop). Edges whose ends are not both among
    ``steps`` are left out."""
    known = set(steps)
    children: dict[K, list[K]] = {}
    waiting = dict.fromkeys(steps, 0)
    for parent, child in set(edges):
        if parent in known and child in known:
            children.setdefault(parent, []).append(child)
            waiting[child] += 1
    layer_of = dict.fromkeys((s for s in steps if waiting[s] == 0), 0)
    ready = list(layer_of)
    while ready:
        step = ready.pop()
        for child in children.get(step, ()):
            layer_of[child] = max(layer_of.get(child, 0), layer_of[step] + 1)
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    circular = frozenset(s for s in steps if waiting[s] > 0)
    last = max((layer_of[s] for s in steps if s not in circular), default=-1) + 1
    for step in circular:
        layer_of[step] = last
    return Layers(layer_of, circular)


def first_by_layer(steps: Sequence[K], found: Layers[K], limit: int) -> list[K]:
    """The first ``limit`` steps by layer, in the order given within a layer."""
    rank = {step: index for index, step in enumerate(steps)}
    return sorted(steps, key=lambda s: (found.layer_of[s], rank[s]))[:limit]


def ordered_columns(
    drawn: Sequence[K], found: Layers[K], edges: Iterable[tuple[K, K]]
) -> list[list[K]]:
    """The drawn steps in columns, one per layer, each ordered by the barycenter of its
    parents' places (a pass down), then of its children's (a pass up). A step's place is its
    distance from its column's middle, as it is drawn."""
    shown = set(drawn)
    columns: list[list[K]] = [[] for _ in range(found.depth)]
    for step in drawn:
        columns[found.layer_of[step]].append(step)
    columns = [column for column in columns if column]
    parents: dict[K, list[K]] = {}
    children: dict[K, list[K]] = {}
    for parent, child in set(edges):
        if parent in shown and child in shown and parent != child:
            parents.setdefault(child, []).append(parent)
            children.setdefault(parent, []).append(child)
    place: dict[K, float] = {}

    def settle(column: list[K]) -> None:
        middle = (len(column) - 1) / 2
        for index, step in enumerate(column):
            place[step] = index - middle

    for column in columns:
        settle(column)
    for sweep, neighbours in ((columns[1:], parents), (columns[-2::-1], children)):
        for column in sweep:
            keys = {}
            for step in column:
                near = [place[n] for n in neighbours.get(step, ()) if n in place]
                keys[step] = sum(near) / len(near) if near else place[step]
            column.sort(key=lambda s: keys[s])  # stable: ties keep their order
            settle(column)
    return columns


@dataclass(frozen=True)
class Box:
    """What a step's box says, formatted by the caller (``timing``) and where it links."""

    name: str
    job_type: str
    status: str
    attempts: int
    max_attempts: int
    timing: str
    url: str | None


def _cut(text: str, limit: int = NAME_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def svg(
    columns: Sequence[Sequence[K]], boxes: Mapping[K, Box], edges: Iterable[tuple[K, K]]
) -> SafeString:
    """The columns as inline SVG: an edge from each parent's box to its child's, then the
    boxes, each a link to its job (when it has a URL) with its whole name in its title."""
    tallest = max((len(column) for column in columns), default=0)
    height = 2 * MARGIN + tallest * NODE_HEIGHT + max(0, tallest - 1) * ROW_GAP
    width = 2 * MARGIN + len(columns) * NODE_WIDTH + max(0, len(columns) - 1) * COLUMN_GAP
    where: dict[K, tuple[int, int]] = {}
    for index, column in enumerate(columns):
        x = MARGIN + index * (NODE_WIDTH + COLUMN_GAP)
        top = (height - len(column) * NODE_HEIGHT - (len(column) - 1) * ROW_GAP) // 2
        for row, step in enumerate(column):
            where[step] = (x, top + row * (NODE_HEIGHT + ROW_GAP))
    drawn = [(p, c) for p, c in dict.fromkeys(edges) if p in where and c in where and p != c]
    lines = format_html_join("", '<path d="{}"/>', ((_edge(where[p], where[c]),) for p, c in drawn))
    nodes = format_html_join("", "{}", ((_box(where[step], boxes[step]),) for step in where))
    return format_html(
        '<svg id="workflow-graph" role="img" aria-label="the steps of the workflow and what each'
        ' waits for" width="{w}" height="{h}" viewBox="0 0 {w} {h}"'
        ' xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="11">'
        '<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7"'
        ' markerHeight="7" orient="auto"><path fill="{edge}" d="M0 0L8 4L0 8z"/></marker></defs>'
        '<g fill="none" stroke="{edge}" stroke-width="1.2" marker-end="url(#arrow)">{lines}</g>'
        "{nodes}</svg>",
        w=width,
        h=height,
        edge=EDGE,
        lines=lines,
        nodes=nodes,
    )


def _edge(parent: tuple[int, int], child: tuple[int, int]) -> str:
    x1, y1 = parent[0] + NODE_WIDTH, parent[1] + NODE_HEIGHT // 2
    x2, y2 = child[0], child[1] + NODE_HEIGHT // 2
    bend = max(COLUMN_GAP // 2, abs(x2 - x1) // 3)
    return f"M{x1} {y1}C{x1 + bend} {y1} {x2 - bend} {y2} {x2} {y2}"


def _box(at: tuple[int, int], box: Box) -> SafeString:
    colour, word = STATUS_STYLES.get(box.status, ("#8a8a8a", box.status))
    x, y = at
    dashes = ' stroke-dasharray="5 3"' if box.status in DASHED else ""
    inner = format_html(
        "<title>{name}\n{job_type}\n{word}, attempt {attempts} of {budget}\n{timing}</title>"
        '<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="4" fill="{colour}"'
        ' fill-opacity="0.12" stroke="{colour}" stroke-width="2"{dashes}/>'
        '<rect x="{x}" y="{y}" width="5" height="{h}" fill="{colour}"/>'
        '<text x="{tx}" y="{y1}" fill="{text}" font-weight="bold">{short_name}</text>'
        '<text x="{tx}" y="{y2}" fill="{quiet}">{short_type}</text>'
        '<text x="{tx}" y="{y3}" fill="{colour}" font-weight="bold">{word}'
        '<tspan fill="{text}" font-weight="normal"> · attempt {attempts}/{budget}</tspan></text>'
        '<text x="{tx}" y="{y4}" fill="{quiet}">{timing}</text>',
        name=box.name,
        job_type=box.job_type,
        word=word,
        attempts=box.attempts,
        budget=box.max_attempts,
        timing=box.timing,
        x=x,
        y=y,
        w=NODE_WIDTH,
        h=NODE_HEIGHT,
        colour=colour,
        dashes=SafeString(dashes),
        tx=x + 11,
        y1=y + 15,
        y2=y + 29,
        y3=y + 44,
        y4=y + 58,
        text=TEXT,
        quiet=QUIET,
        short_name=_cut(box.name),
        short_type=_cut(box.job_type, NAME_CHARS + 4),
    )
    if box.url is None:
        return format_html('<g class="step step-{}">{}</g>', box.status, inner)
    return format_html('<a class="step step-{}" href="{}">{}</a>', box.status, box.url, inner)
