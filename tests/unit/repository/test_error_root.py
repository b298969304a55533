"""Every exception Conveyor defines descends from `conveyor.errors.ConveyorError` (issue 37, one toolkit)."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

from conveyor.errors import ConveyorError

SRC = Path(__file__).resolve().parents[3] / "src" / "conveyor"
BUILTIN_EXCEPTIONS = {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}


def _base_names(node: ast.ClassDef) -> list[str]:
    return [base.id if isinstance(base, ast.Name) else ast.unparse(base) for base in node.bases]


def test_no_exception_class_derives_from_a_builtin_alone() -> None:
    alone = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = _base_names(node)
                if any(b in BUILTIN_EXCEPTIONS for b in bases) and "ConveyorError" not in [*bases, node.name]:
                    alone.append(f"{path.relative_to(SRC)}: {node.name}({', '.join(bases)})")
    assert alone == [], "derive these from ConveyorError (keep the builtin as a second base):\n" + "\n".join(
        alone
    )


def test_a_builtin_kind_is_still_caught_as_that_kind() -> None:
    from conveyor.events.cron import InvalidCron
    from conveyor.sdk.context import SecretNotFound

    assert issubclass(InvalidCron, ConveyorError) and issubclass(InvalidCron, ValueError)
    assert issubclass(SecretNotFound, ConveyorError) and issubclass(SecretNotFound, KeyError)
