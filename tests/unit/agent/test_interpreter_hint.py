"""The last job's venv interpreter, recorded for the next ready runner's spares: only a built venv's counts."""

from __future__ import annotations

import os
from pathlib import Path

from conveyor.agent.requirements import (
    LAST_INTERPRETER_FILE,
    READY_MARKER,
    remember_interpreter,
    remembered_interpreter,
    venv_python,
)


def built_venv(venvs: Path, name: str = "abc") -> Path:
    venv = venvs / name
    python = venv_python(venv)
    python.parent.mkdir(parents=True)
    python.write_text("")
    (venv / READY_MARKER).write_text("")
    return python


def test_a_remembered_venv_interpreter_is_given_back(tmp_path: Path) -> None:
    python = built_venv(tmp_path / "venvs")
    remember_interpreter(tmp_path / "venvs", str(python))
    assert remembered_interpreter(tmp_path / "venvs") == str(python)


def test_a_job_without_requirements_forgets_it(tmp_path: Path) -> None:
    python = built_venv(tmp_path / "venvs")
    remember_interpreter(tmp_path / "venvs", str(python))
    remember_interpreter(tmp_path / "venvs", None)
    assert remembered_interpreter(tmp_path / "venvs") is None
    assert not (tmp_path / "venvs" / LAST_INTERPRETER_FILE).exists()


def test_nothing_remembered_is_none(tmp_path: Path) -> None:
    assert remembered_interpreter(tmp_path / "venvs") is None


def test_a_venv_being_built_or_deleted_is_not_used(tmp_path: Path) -> None:
    python = built_venv(tmp_path / "venvs")
    remember_interpreter(tmp_path / "venvs", str(python))
    (python.parent.parent / READY_MARKER).unlink()
    assert remembered_interpreter(tmp_path / "venvs") is None


def test_an_interpreter_outside_the_venvs_directory_is_ignored(tmp_path: Path) -> None:
    elsewhere = built_venv(tmp_path / "elsewhere")
    (tmp_path / "venvs").mkdir()
    (tmp_path / "venvs" / LAST_INTERPRETER_FILE).write_text(str(elsewhere))
    assert remembered_interpreter(tmp_path / "venvs") is None
    sneaky = tmp_path / "venvs" / "abc" / ".." / ".." / "elsewhere" / "abc" / "bin" / "python"
    (tmp_path / "venvs" / LAST_INTERPRETER_FILE).write_text(os.fspath(sneaky))
    assert remembered_interpreter(tmp_path / "venvs") is None


def test_a_path_that_is_not_a_venv_s_interpreter_is_ignored(tmp_path: Path) -> None:
    built_venv(tmp_path / "venvs")
    script = tmp_path / "venvs" / "abc" / "bin" / "tool"
    script.write_text("")
    (tmp_path / "venvs" / LAST_INTERPRETER_FILE).write_text(str(script))
    assert remembered_interpreter(tmp_path / "venvs") is None
