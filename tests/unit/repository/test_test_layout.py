"""Tests mirror `src/conveyor`: a folder of `tests/unit` or `tests/integration` is named by what it tests (issue 37).

A folder is named by a package of `src/conveyor`, or by one of its top-level modules (`aio.py`, `heap.py`)
that no package holds; the few folders that test something outside `src/conveyor` or the repository as a
whole are listed below with the reason. No test file lies directly in a tier, where nothing says what it
tests. `tests/e2e` is the scenario tier and flat. What test modules share lives in `tests/support/`: no test
module imports another, but for the few listed with their reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "src" / "conveyor"
TIERS = ("tests/unit", "tests/integration")

# Folders named by no package of `src/conveyor`: name -> what they test instead.
NOT_A_PACKAGE = {
    "repository": "the repository as a whole: import layers, module sizes, design references, knob and "
    "settings coverage, the bench scripts",
    "chaos": "the chaos harness in chaos/ (its fault schedule and checker), which is not in src/conveyor",
    "support": "the tests' own machinery in tests/support/ (ports, preloaded processes, the Docker engine)",
    "knobs": "one behaviour test per knob of conveyor.model.knobs, across every package; "
    "repository/test_knob_coverage.py reads its table",
}


def source_names(package: Path) -> set[str]:
    """The names a test folder may take: `package`'s subpackages and top-level modules."""
    names = {path.name for path in package.iterdir() if (path / "__init__.py").is_file()}
    names |= {path.stem for path in package.glob("*.py") if not path.stem.startswith("_")}
    return names


def misplaced(root: Path, tiers: tuple[str, ...], allowed: set[str]) -> list[str]:
    """Paths under `tiers` of `root` that break the layout: a folder named by nothing in `allowed`, or
    a test file directly in a tier."""
    found = []
    for tier in tiers:
        for path in sorted((root / tier).iterdir()):
            relative = path.relative_to(root).as_posix()
            if path.is_dir() and path.name != "__pycache__" and path.name not in allowed:
                found.append(f"{relative}/: a folder named by no package of src/conveyor")
            elif path.is_file() and path.name.startswith("test_") and path.suffix == ".py":
                found.append(f"{relative}: a test file outside a package's folder")
    return found


def test_every_test_folder_is_named_by_what_it_tests() -> None:
    allowed = source_names(PACKAGE) | set(NOT_A_PACKAGE)
    found = misplaced(ROOT, TIERS, allowed)
    assert found == [], "\n".join(found)


def test_no_listed_folder_is_a_package_or_unused() -> None:
    """An entry of NOT_A_PACKAGE that names a package needs no reason; one no tier has is stale."""
    assert set(NOT_A_PACKAGE) & source_names(PACKAGE) == set()
    present = {path.name for tier in TIERS for path in (ROOT / tier).iterdir() if path.is_dir()}
    assert set(NOT_A_PACKAGE) <= present


def test_a_misplaced_file_and_folder_are_found(tmp_path: Path) -> None:
    package = tmp_path / "src" / "conveyor"
    (package / "execution").mkdir(parents=True)
    (package / "execution" / "__init__.py").touch()
    (package / "heap.py").touch()
    (package / "__init__.py").touch()
    for folder in ("unit/execution", "unit/heap", "unit/support", "integration/dispatch"):
        (tmp_path / "tests" / folder).mkdir(parents=True)
    (tmp_path / "tests/unit/__init__.py").touch()
    (tmp_path / "tests/unit/__pycache__").mkdir()
    (tmp_path / "tests/unit/test_loose.py").touch()
    (tmp_path / "tests/unit/execution/test_placed.py").touch()

    allowed = source_names(package) | {"support"}

    assert allowed == {"execution", "heap", "support"}
    assert misplaced(tmp_path, TIERS, allowed) == [
        "tests/unit/test_loose.py: a test file outside a package's folder",
        "tests/integration/dispatch/: a folder named by no package of src/conveyor",
    ]


# Test modules other test modules may import, with the reason.
IMPORTED_TEST_MODULES = {
    "tests.integration.knobs.test_knobs": "its KNOB_TESTS table, which repository/test_knob_coverage.py reads",
}


def imported_test_modules(root: Path) -> dict[str, list[str]]:
    """Each test module (`test_*.py`) that a file under `root/tests` imports -> the files importing it."""
    importers: dict[str, list[str]] = {}
    for path in sorted((root / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                leaf = node.module.rsplit(".", 1)[-1]
                if node.module.startswith("tests.") and leaf.startswith("test_"):
                    importers.setdefault(node.module, []).append(path.relative_to(root).as_posix())
    return importers


def test_test_modules_are_not_imported_by_other_tests_helpers_live_in_tests_support() -> None:
    imported = {
        module: files
        for module, files in imported_test_modules(ROOT).items()
        if module not in IMPORTED_TEST_MODULES
    }
    assert not imported, f"move what these test modules share into tests/support/: {imported}"


def test_the_import_check_finds_a_helper_imported_from_a_test_module(tmp_path: Path) -> None:
    (tmp_path / "tests" / "support").mkdir(parents=True)
    (tmp_path / "tests" / "test_b.py").write_text("from tests.integration.x.test_a import helper\n")
    (tmp_path / "tests" / "support" / "ok.py").write_text("from tests.support.waiting import wait_until\n")
    assert imported_test_modules(tmp_path) == {"tests.integration.x.test_a": ["tests/test_b.py"]}
