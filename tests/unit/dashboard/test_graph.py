"""The run page's job graph: columns by the longest `needs` chain, one arrow per needed job."""

from __future__ import annotations

from typing import Any

from conveyor.dashboard.graph import (
    COLUMN_GAP,
    MARGIN,
    NODE_HEIGHT,
    NODE_WIDTH,
    ROW_GAP,
    job_layers,
    layout_job_graph,
)


def _job(name: str, *needs: str, status: str = "success", job_id: str | None = None) -> dict[str, Any]:
    return {
        "id": job_id or f"id-{name}",
        "name": name,
        "display_name": name,
        "status": status,
        "needs": list(needs),
    }


DIAMOND = [_job("a"), _job("b", "a"), _job("c", "a"), _job("d", "b", "c")]


def test_a_diamond_has_three_columns_four_boxes_and_four_arrows() -> None:
    graph = layout_job_graph(DIAMOND)
    assert job_layers(DIAMOND) == {"a": 0, "b": 1, "c": 1, "d": 2}
    assert [(n.name, n.layer, n.row) for n in graph.nodes] == [
        ("a", 0, 0),
        ("b", 1, 0),
        ("c", 1, 1),
        ("d", 2, 0),
    ]
    assert sorted((e.source, e.target) for e in graph.edges) == [
        ("id-a", "id-b"),
        ("id-a", "id-c"),
        ("id-b", "id-d"),
        ("id-c", "id-d"),
    ]
    assert graph.width == 2 * MARGIN + 3 * NODE_WIDTH + 2 * COLUMN_GAP
    assert graph.height == 2 * MARGIN + 2 * NODE_HEIGHT + ROW_GAP


def test_a_short_column_is_centred_against_the_tallest() -> None:
    nodes = {n.name: n for n in layout_job_graph(DIAMOND).nodes}
    assert nodes["b"].y == MARGIN and nodes["c"].y == MARGIN + NODE_HEIGHT + ROW_GAP
    middle = (nodes["b"].y + nodes["c"].y) // 2
    assert nodes["a"].y == nodes["d"].y == middle
    assert nodes["a"].x == MARGIN and nodes["d"].x == MARGIN + 2 * (NODE_WIDTH + COLUMN_GAP)


def test_an_arrow_leaves_the_right_side_and_enters_the_left_side() -> None:
    graph = layout_job_graph([_job("a"), _job("b", "a")])
    a, b = graph.nodes
    [edge] = graph.edges
    start = f"M {a.x + NODE_WIDTH} {a.y + NODE_HEIGHT // 2} "
    assert edge.path.startswith(start) and edge.path.endswith(f"{b.x} {b.y + NODE_HEIGHT // 2}")


def test_the_column_is_the_longest_chain_not_the_shortest() -> None:
    # d needs a directly and through b → c: it sits after c, so every arrow points right.
    jobs = [_job("a"), _job("b", "a"), _job("c", "b"), _job("d", "a", "c")]
    assert job_layers(jobs) == {"a": 0, "b": 1, "c": 2, "d": 3}
    graph = layout_job_graph(jobs)
    by_id = {n.job_id: n for n in graph.nodes}
    assert all(by_id[e.source].layer < by_id[e.target].layer for e in graph.edges)
    assert len(graph.edges) == 4


def test_matrix_jobs_share_a_column_and_each_gets_the_arrows_of_its_name() -> None:
    jobs = [
        _job("build"),
        _job("test", "build", job_id="t1"),
        _job("test", "build", job_id="t2"),
        _job("deploy", "test"),
    ]
    graph = layout_job_graph(jobs)
    assert [(n.job_id, n.layer) for n in graph.nodes] == [
        ("id-build", 0),
        ("t1", 1),
        ("t2", 1),
        ("id-deploy", 2),
    ]
    assert sorted((e.source, e.target) for e in graph.edges) == [
        ("id-build", "t1"),
        ("id-build", "t2"),
        ("t1", "id-deploy"),
        ("t2", "id-deploy"),
    ]


def test_a_need_outside_the_run_and_a_cycle_draw_no_arrow_and_hide_no_job() -> None:
    outside = layout_job_graph([_job("a", "gone")])
    assert [(n.name, n.layer) for n in outside.nodes] == [("a", 0)] and outside.edges == ()
    cycle = layout_job_graph([_job("a", "b"), _job("b", "a")])
    assert sorted(n.name for n in cycle.nodes) == ["a", "b"]
    assert len(cycle.edges) == 1  # the arrow that closes the cycle is cut


def test_labels_are_shortened_with_the_full_name_kept_and_statuses_carried() -> None:
    long_name = "integration-tests-on-postgresql-16"
    [node] = layout_job_graph([_job(long_name, status="running")]).nodes
    assert node.full_label == long_name and node.label.endswith("…") and len(node.label) == 22
    assert node.status == "running"


def test_no_jobs_is_an_empty_drawing() -> None:
    graph = layout_job_graph([])
    assert graph.nodes == () and graph.edges == () and (graph.width, graph.height) == (0, 0)
