"""Fixtures for compiling throwaway repositories (the compiler only reads files)."""

from collections.abc import Callable
from pathlib import Path

import pytest

WriteWorkflow = Callable[[str, str], Path]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """An empty repository root with `.conveyor/workflows/`."""
    (tmp_path / ".conveyor" / "workflows").mkdir(parents=True)
    return tmp_path


@pytest.fixture
def write_workflow(repo: Path) -> WriteWorkflow:
    """Write `.conveyor/workflows/<name>.py`."""

    def write(name: str, source: str) -> Path:
        path = repo / ".conveyor" / "workflows" / f"{name}.py"
        path.write_text(source, encoding="utf-8")
        return path

    return write
