"""`need_result`: what `ctx.needs[job]` says, on an agent and under `run local` alike."""

from __future__ import annotations

import itertools

from conveyor.model.needs import NeedMember, need_result
from conveyor.model.states import JOB_TERMINAL, aggregate_status


def test_a_plain_upstream_gives_its_outputs_and_no_matrix() -> None:
    result = need_result([NeedMember("", "success", {"build": {"wheel": "a.whl"}})])
    assert result == {"status": "success", "outputs": {"build": {"wheel": "a.whl"}}, "by_matrix": {}}


def test_a_matrix_upstream_merges_its_combinations_in_matrix_order_and_keeps_each() -> None:
    members = [
        NeedMember("n=1", "success", {"compile": {"cell": "1", "shared": "1"}, "first": {"only": True}}),
        NeedMember("n=2", "failed", {"compile": {"cell": "2"}}),
        NeedMember("n=3", "success", {"compile": {"shared": "3"}}),
    ]
    result = need_result(members)
    assert result == {
        "status": "failed",
        "outputs": {"compile": {"cell": "2", "shared": "3"}, "first": {"only": True}},
        "by_matrix": {
            "n=1": {
                "status": "success",
                "outputs": {"compile": {"cell": "1", "shared": "1"}, "first": {"only": True}},
            },
            "n=2": {"status": "failed", "outputs": {"compile": {"cell": "2"}}},
            "n=3": {"status": "success", "outputs": {"compile": {"shared": "3"}}},
        },
    }


def test_a_single_combination_matrix_is_still_a_matrix() -> None:
    result = need_result([NeedMember("py=3.12", "success", {"s": {"k": 1}})])
    assert result is not None
    assert result["outputs"] == {"s": {"k": 1}}
    assert result["by_matrix"] == {"py=3.12": {"status": "success", "outputs": {"s": {"k": 1}}}}


def test_no_result_while_a_combination_is_unfinished() -> None:
    assert need_result([NeedMember("n=1", "success", None), NeedMember("n=2", "running", None)]) is None


def test_the_status_is_the_aggregate_for_every_pair_of_terminal_statuses() -> None:
    for first, second in itertools.product(sorted(JOB_TERMINAL), repeat=2):
        result = need_result([NeedMember("n=1", first, None), NeedMember("n=2", second, None)])
        assert result is not None
        assert result["status"] == aggregate_status([first, second])
        assert result["outputs"] == {}
        assert [entry["status"] for entry in result["by_matrix"].values()] == [first, second]
