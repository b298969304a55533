"""No cycle among the packages of `src/conveyor`, lazy imports included (issue 37).

The layer contract (`test_layers.py`, import-linter) already forbids an upward import; this test states the
property the layers exist for with nothing but `ast`: build the graph of which package imports which, from
every `import` statement wherever it sits (module level, inside a function, under `TYPE_CHECKING`), and
check that it has a topological order.
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[3] / "src"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level == 0:
        return [node.module or ""]
    # A relative import: `from . import x` in `a.b.c` names `a.b`; in the package `a.b` itself, `a.b`.
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return [".".join([*base, *([node.module] if node.module else [])])]


def package_graph(root: Path, top: str = "conveyor") -> dict[str, set[str]]:
    """Each package (or top-level module) of `top` under `root` → the others it imports, every import
    statement counted."""
    graph: dict[str, set[str]] = {}
    for path in sorted((root / top).rglob("*.py")):
        module = _module_name(path, root)
        parts = module.split(".")
        if len(parts) < 2:
            continue  # `conveyor/__init__.py` re-exports the SDK; it is the distribution, not a package
        source = parts[1]
        graph.setdefault(source, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for name in _imported(node, module, path.name == "__init__.py"):
                target = name.split(".")
                if len(target) >= 2 and target[0] == top and target[1] != source:
                    graph[source].add(target[1])
    return graph


def cycle_in(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph (its packages in import order), or None."""
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as error:
        return list(error.args[1])
    return None


def test_the_packages_import_each_other_without_a_cycle() -> None:
    graph = package_graph(SRC)
    assert {"server", "execution", "agent", "cluster"} <= graph.keys()  # the walk still finds the tree
    assert "execution" in graph["agents"], "the graph holds the edges it should"
    assert cycle_in(graph) is None


@pytest.mark.parametrize(
    "lazy_import",
    [
        "def f():\n    from pkg.high import thing\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high import thing\n",
        "def f():\n    from ..high import thing\n",
    ],
)
def test_a_lazy_import_back_up_is_a_cycle(tmp_path: Path, lazy_import: str) -> None:
    (tmp_path / "pkg" / "high").mkdir(parents=True)
    (tmp_path / "pkg" / "low").mkdir()
    for folder in ("pkg", "pkg/high", "pkg/low"):
        (tmp_path / folder / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "pkg" / "high" / "top.py").write_text("from pkg.low.base import thing\n", encoding="utf-8")
    (tmp_path / "pkg" / "low" / "base.py").write_text("thing = 1\n", encoding="utf-8")
    assert cycle_in(package_graph(tmp_path, "pkg")) is None
    (tmp_path / "pkg" / "low" / "later.py").write_text(lazy_import, encoding="utf-8")
    found = cycle_in(package_graph(tmp_path, "pkg"))
    assert found is not None and set(found) == {"high", "low"}
