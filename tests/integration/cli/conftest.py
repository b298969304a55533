"""Real `conveyor` processes against real git repositories made with `git init -b main`."""

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.repos import GIT_ENV

CONVEYOR = str(Path(sys.executable).with_name("conveyor"))

Run = Callable[..., subprocess.CompletedProcess[str]]


def make_repo(path: Path) -> Path:
    """A git repository on `main` with one commit."""
    path.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **GIT_ENV, "HOME": str(path)}
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=path, check=True, env=env)
    (path / "README.md").write_text("hello\n")
    subprocess.run(["git", "add", "README.md"], cwd=path, check=True, env=env)
    subprocess.run(["git", "commit", "-q", "-m", "initial"], cwd=path, check=True, env=env)
    return path


def run_conveyor(repo: Path, *args: str, hash_seed: str = "0") -> subprocess.CompletedProcess[str]:
    """Run the installed `conveyor` command in `repo`."""
    env = {**os.environ, **GIT_ENV, "HOME": str(repo), "PYTHONHASHSEED": hash_seed}
    return subprocess.run([CONVEYOR, *args], cwd=repo, capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A fresh repository with one commit."""
    return make_repo(tmp_path / "repo")


@pytest.fixture
def conveyor(repo: Path) -> Run:
    """`conveyor(...)` runs the CLI in `repo`."""
    return lambda *args, **kwargs: run_conveyor(repo, *args, **kwargs)


EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def install_examples(repo: Path) -> None:
    """Copy every example workflow into the repository's `.conveyor/workflows/`."""
    workflows = repo / ".conveyor" / "workflows"
    workflows.mkdir(parents=True, exist_ok=True)
    for example in sorted(EXAMPLES.glob("*.py")):
        shutil.copy(example, workflows / example.name)
