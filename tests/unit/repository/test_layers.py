"""Imports go one way: the layer table of docs/design/ARCHITECTURE.md §3 holds (issue 37).

`lint-imports` (import-linter) checks the contracts of pyproject.toml's `[tool.importlinter]` against every
import of `src/conveyor`, lazy and `TYPE_CHECKING` ones included; scripts/test.sh runs it too, and this
test makes `pytest` alone catch a broken layer. The contracts are a copy of the table, so a further test
checks that the two agree, and one more that a lazy or type-only import upward really does break them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
ARCHITECTURE = ROOT / "docs/design/ARCHITECTURE.md"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
SEPARATORS = re.compile(r"\s*[|:]\s*")
# A row of the table: `| 9 | `cluster` | ...` (layer "—" for the agent program's separate stack).
TABLE_ROW = re.compile(r"^\|\s*(?P<layer>\d+|—)\s*\|(?P<packages>[^|]*)\|", re.MULTILINE)


def lint_imports(cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],  # it reads `cwd`'s pyproject.toml
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    found: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return found


def contract(kind: str) -> dict[str, Any]:
    (found,) = [c for c in contracts() if c["type"] == kind]
    return found


def table_layers() -> dict[str, str]:
    """Package (or top-level module) → its layer in the table of docs/design/ARCHITECTURE.md §3."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text[text.index("## 3.") : text.index("## 4.")]
    layers: dict[str, str] = {}
    for row in TABLE_ROW.finditer(section):
        for name in re.findall(r"`([\w]+)`", row["packages"]):
            assert name not in layers, f"{name} is in two rows of the table"
            layers[name] = row["layer"]
    return layers


def test_imports_follow_the_layer_table() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_contracts_are_the_table() -> None:
    table = table_layers()
    layers = [SEPARATORS.split(layer) for layer in contract("layers")["layers"]]
    in_contract = [name for layer in layers for name in layer]
    assert sorted(in_contract) == sorted(table), "the contract and the table name different packages"
    previous = None
    for index, layer in enumerate(layers):
        numbers = {table[name] for name in layer}
        if numbers == {"—"}:
            continue  # a separate stack: it may import only what lies below it (checked next)
        numbered = {int(n) for n in numbers - {"—"}}
        assert len(numbered) == 1, f"{layer} spans table layers {sorted(numbered)}"
        (number,) = numbered
        assert previous is None or number <= previous, (
            f"{layer} (layer {number}) is listed above layer {previous}"
        )
        previous = number
        if "—" in numbers:
            below = {int(table[name]) for lower in layers[index + 1 :] for name in lower}
            assert max(below) <= 1, "the agent program may import layers 0-1 only"
    # Everything between the agent program and the CLI is forbidden to import it.
    orchestrator = {f"conveyor.{name}" for name, n in table.items() if n != "—" and 2 <= int(n) <= 10}
    forbidden = contract("forbidden")
    assert set(forbidden["source_modules"]) == orchestrator
    assert forbidden["forbidden_modules"] == ["conveyor.agent"]


def test_a_lazy_or_type_only_import_upward_breaks_the_layers(tmp_path: Path) -> None:
    """The checker sees imports inside functions and under `TYPE_CHECKING`, not only module-level ones."""
    src = tmp_path / "src"
    shutil.copytree(
        ROOT / "src" / "conveyor",
        src / "conveyor",
        ignore=shutil.ignore_patterns("__pycache__", "static", "templates", "migrations"),
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (src / "conveyor" / "db" / "channels.py").open("a", encoding="utf-8") as module:
        module.write("\n\ndef lazy() -> None:\n    from conveyor.server import startup  # noqa: F401\n")
    with (src / "conveyor" / "runtime" / "node.py").open("a", encoding="utf-8") as module:
        module.write(
            "\n\nif TYPE_CHECKING:\n    from conveyor.server.state import ServerState  # noqa: F401\n"
        )
    # The copy comes first on the path, ahead of the editable install of the real tree.
    env = {**os.environ, "PYTHONPATH": str(src)}
    result = lint_imports(tmp_path, env)
    assert result.returncode != 0, result.stdout
    assert "conveyor.db.channels -> conveyor.server.startup" in result.stdout
    assert "conveyor.runtime.node -> conveyor.server.state" in result.stdout
