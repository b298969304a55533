"""The grouping of the cluster tests (tests/support/groups.py): only their SQLite cases get a group of their own."""

from __future__ import annotations

import pytest

from tests.support.groups import SQLITE_GROUP, split_group


@pytest.mark.parametrize(
    ("groups", "params", "expected"),
    [
        ({"cluster-processes"}, {"database_url": "sqlite"}, SQLITE_GROUP),
        ({"cluster-jobs"}, {"database_url": "sqlite", "scenario": 7}, SQLITE_GROUP),
        ({"cluster-processes"}, {"database_url": "postgresql"}, None),
        ({"cluster-jobs"}, {}, None),
        ({"chaos"}, {"database_url": "sqlite"}, None),
        (set(), {"database_url": "sqlite"}, None),
    ],
)
def test_only_a_cluster_tests_sqlite_case_gets_the_extra_group(
    groups: set[str], params: dict[str, object], expected: str | None
) -> None:
    assert split_group(groups, params) == expected
