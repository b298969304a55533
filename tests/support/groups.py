"""A pytest plugin (loaded by tests/conftest.py) that runs the cluster tests' SQLite cases in a group of their own.

The cluster tests share the xdist group "cluster-processes" so that one runs at a time: each starts
several servers, and several at once on PostgreSQL ran out of its default 100 connections. A case whose
coordinators use SQLite opens no PostgreSQL connection, so it joins a second group and runs on another
worker beside the PostgreSQL ones. pytest-xdist names a test's group by joining its `xdist_group`
marks, so adding a mark is enough; this hook runs before xdist's own, which reads them.
"""

from __future__ import annotations

import pytest

CLUSTER_GROUP = "cluster-processes"
SQLITE_GROUP = "sqlite"


def split_group(groups: set[str], params: dict[str, object]) -> str | None:
    """The extra group of a test in `groups` with parameters `params`, if it gets one."""
    if CLUSTER_GROUP in groups and "sqlite" in params.values():
        return SQLITE_GROUP
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        groups = {str(mark.args[0]) for mark in item.iter_markers("xdist_group") if mark.args}
        callspec = getattr(item, "callspec", None)
        extra = split_group(groups, dict(callspec.params) if callspec is not None else {})
        if extra is not None:
            item.add_marker(pytest.mark.xdist_group(extra))
