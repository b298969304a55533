"""The run page's job graph: where each job's box goes and which boxes the `needs` arrows join.

Pure geometry for the server-rendered SVG (no layout engine in the browser, no build step): a job's
column is the longest chain of `needs` leading to it, so every arrow points rightwards; boxes in a column
are stacked in the order given (the page's `needs` order) and centred against the tallest column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NODE_WIDTH = 176
NODE_HEIGHT = 46
COLUMN_GAP = 56
ROW_GAP = 14
MARGIN = 8
LABEL_CHARS = 22


@dataclass(frozen=True)
class GraphNode:
    """One job's box: its id (for live status updates), label, status and top-left corner."""

    job_id: str
    name: str
    label: str
    full_label: str
    status: str
    layer: int
    row: int
    x: int
    y: int


@dataclass(frozen=True)
class GraphEdge:
    """An arrow from a needed job's box to the job that needs it, as an SVG path."""

    source: str
    target: str
    path: str


@dataclass(frozen=True)
class JobGraph:
    """Boxes, arrows and the drawing's size."""

    nodes: tuple[GraphNode, ...]
    edges: tuple[GraphEdge, ...]
    width: int
    height: int


def job_layers(jobs: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Each job name's column: 0 for a job that needs nothing in the run, else 1 + its deepest need.

    Matrix jobs share a name and a column. A need on a name that is not in the run draws nothing and
    places nothing; a cycle (which the compiler refuses) is cut where it closes instead of looping.
    """
    needs: dict[str, set[str]] = {}
    for job in jobs:
        needs.setdefault(job["name"], set()).update(job.get("needs") or ())
    layers: dict[str, int] = {}
    visiting: set[str] = set()

    def layer_of(name: str) -> int:
        if name in layers:
            return layers[name]
        visiting.add(name)
        deepest = -1
        for need in sorted(needs[name]):
            if need in needs and need not in visiting:
                deepest = max(deepest, layer_of(need))
        visiting.discard(name)
        layers[name] = deepest + 1
        return layers[name]

    for name in needs:
        layer_of(name)
    return layers


def _short(label: str) -> str:
    return label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1] + "…"


def layout_job_graph(jobs: Sequence[Mapping[str, Any]]) -> JobGraph:
    """Boxes by `job_layers`, rows in the given order, and one arrow per (needed job, job) pair."""
    layers = job_layers(jobs)
    columns: dict[int, list[Mapping[str, Any]]] = {}
    for job in jobs:
        columns.setdefault(layers[job["name"]], []).append(job)
    tallest = max((len(column) for column in columns.values()), default=0)
    step_y = NODE_HEIGHT + ROW_GAP
    nodes: list[GraphNode] = []
    for layer in sorted(columns):
        column = columns[layer]
        # Centre a short column against the tallest, in whole pixels.
        offset = (tallest - len(column)) * step_y // 2
        for row, job in enumerate(column):
            label = str(job.get("display_name") or job["name"])
            nodes.append(
                GraphNode(
                    job_id=str(job["id"]),
                    name=str(job["name"]),
                    label=_short(label),
                    full_label=label,
                    status=str(job.get("status") or "unknown"),
                    layer=layer,
                    row=row,
                    x=MARGIN + layer * (NODE_WIDTH + COLUMN_GAP),
                    y=MARGIN + offset + row * step_y,
                )
            )
    by_name: dict[str, list[GraphNode]] = {}
    for node in nodes:
        by_name.setdefault(node.name, []).append(node)
    edges: list[GraphEdge] = []
    for job, node in zip(_in_node_order(jobs, nodes), nodes, strict=True):
        for need in sorted(set(job.get("needs") or ())):
            for upstream in by_name.get(need, ()):
                if upstream.layer < node.layer:
                    edges.append(GraphEdge(upstream.job_id, node.job_id, _arrow(upstream, node)))
    width = MARGIN * 2 + len(columns) * NODE_WIDTH + max(0, len(columns) - 1) * COLUMN_GAP
    height = MARGIN * 2 + tallest * NODE_HEIGHT + max(0, tallest - 1) * ROW_GAP
    return JobGraph(tuple(nodes), tuple(edges), width if nodes else 0, height if nodes else 0)


def _in_node_order(jobs: Sequence[Mapping[str, Any]], nodes: Sequence[GraphNode]) -> list[Mapping[str, Any]]:
    by_id = {str(job["id"]): job for job in jobs}
    return [by_id[node.job_id] for node in nodes]


def _arrow(source: GraphNode, target: GraphNode) -> str:
    """A curve from the right middle of `source` to the left middle of `target`."""
    x1, y1 = source.x + NODE_WIDTH, source.y + NODE_HEIGHT // 2
    x2, y2 = target.x, target.y + NODE_HEIGHT // 2
    bend = (x2 - x1) // 2
    return f"M {x1} {y1} C {x1 + bend} {y1}, {x2 - bend} {y2}, {x2} {y2}"
