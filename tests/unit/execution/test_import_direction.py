"""`creation` → `cancel` → `lifecycle` import in one direction, at module level only.

They used to import each other inside functions to dodge a circular import; these tests keep the
circle from coming back (read from the source with `ast`, so a function-level import counts too).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import conveyor.execution

PACKAGE = "conveyor.execution"
MODULES = ("creation", "cancel", "lifecycle")
# Each module may import only the ones after it: creation may use cancel and lifecycle, cancel may use
# lifecycle, and lifecycle neither.
ORDER = {name: position for position, name in enumerate(MODULES)}


def imported_siblings(module: str) -> list[tuple[str, bool]]:
    """(sibling imported, whether at module level) for every import of `MODULES` in `module`'s source."""
    path = Path(conveyor.execution.__file__).parent / f"{module}.py"
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module == PACKAGE:
                names = [alias.name for alias in node.names]
            else:
                names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            sibling = name.removeprefix(f"{PACKAGE}.")
            if sibling in MODULES and sibling != module:
                found.append((sibling, id(node) in top_level))
    return found


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_only_modules_below_it(module: str) -> None:
    upward = [sibling for sibling, _ in imported_siblings(module) if ORDER[sibling] < ORDER[module]]
    assert upward == [], f"{module} imports {upward}, which import it (directly or not)"


@pytest.mark.parametrize("module", MODULES)
def test_no_function_level_imports_between_them(module: str) -> None:
    hidden = [sibling for sibling, top_level in imported_siblings(module) if not top_level]
    assert hidden == [], f"{module} imports {hidden} inside a function"


def test_the_rule_is_not_vacuous() -> None:
    # The parse must see the real imports, or the tests above would pass on anything.
    assert ("cancel", True) in imported_siblings("creation")
    assert ("lifecycle", True) in imported_siblings("cancel")


@pytest.mark.parametrize("first", MODULES)
def test_each_module_imports_first_in_a_fresh_interpreter(first: str) -> None:
    others = [name for name in MODULES if name != first]
    code = "; ".join(f"import {PACKAGE}.{name}" for name in (first, *others))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
