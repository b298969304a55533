"""Route and service modules hold no SQL: their queries live in their package's store modules (issue 37).

A route handler checks the principal, calls store functions in a transaction and shapes the answer; a
service holds a package's logic between its routes and its stores. A query written inline in either is one
the store's tests and readers never see.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[3] / "src/conveyor"
# Every module of HTTP routes: `routes.py`, `*_routes.py`, and the admin package's `routes/` folder.
ROUTE_MODULES = sorted(
    str(path.relative_to(SRC))
    for path in [*SRC.glob("*/routes.py"), *SRC.glob("*/*_routes.py"), *SRC.glob("*/routes/*.py")]
)
# Every package's service module: `service.py` and `*_service.py`.
SERVICE_MODULES = sorted(
    str(path.relative_to(SRC)) for path in [*SRC.glob("*/service.py"), *SRC.glob("*/*_service.py")]
)
# The admin route dependencies every route module uses: the access-log row of a change is written by the
# admin package's store, handed over by its guard.
SHARED_MODULES = ["http/deps.py"]
SQL_MODULES = ("sqlalchemy", "conveyor.db.tables", "conveyor.db.driver_sql")
# What a route or service module may import from them: the one organisation's id (docs/design/ARCHITECTURE.md §4,
# "Tenancy") and the connection's type, to hand a store function's callback its annotation.
NOT_SQL = {"DEFAULT_ORG", "AsyncConnection"}


def sql_in(path: Path) -> list[str]:
    """Where a module imports SQL building blocks or runs a statement itself (`….execute(…)`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(SQL_MODULES):
            if {a.name for a in node.names} <= NOT_SQL:
                continue
            found.append(f"line {node.lineno}: from {node.module} import …")
        elif isinstance(node, ast.Import):
            found += [
                f"line {node.lineno}: import {a.name}" for a in node.names if a.name.startswith(SQL_MODULES)
            ]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "execute"
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node.func)}(…)")
    return found


def test_the_globs_still_find_the_modules() -> None:
    assert len(ROUTE_MODULES) > 10
    assert {"artifacts/service.py", "ingest/service.py", "secrets/service.py"} <= set(SERVICE_MODULES)


@pytest.mark.parametrize("module", ROUTE_MODULES + SERVICE_MODULES + SHARED_MODULES)
def test_a_route_or_service_module_runs_no_sql_of_its_own(module: str) -> None:
    assert sql_in(SRC / module) == []


def test_the_check_sees_an_inline_query(tmp_path: Path) -> None:
    routes = tmp_path / "routes.py"
    routes.write_text(
        "from sqlalchemy import select\nasync def f(conn, t):\n    await conn.execute(select(t))\n",
        encoding="utf-8",
    )
    assert sql_in(routes) == ["line 1: from sqlalchemy import …", "line 3: conn.execute(…)"]
