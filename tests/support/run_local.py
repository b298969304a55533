"""`conveyor run local` on a repository with a workflow, as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.repos import GIT_ENV

# Short, so the tests' cancels and timeouts end quickly.
KILL_GRACE_MS = "500"

CONVEYOR = str(Path(sys.executable).with_name("conveyor"))


def cli(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env.update(GIT_ENV, HOME=str(repo.parent), CONVEYOR_KILL_GRACE_MS=KILL_GRACE_MS, TMPDIR=str(repo.parent))
    return subprocess.run([CONVEYOR, *args], cwd=repo, capture_output=True, text=True, env=env, timeout=120)


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV, "HOME": str(repo.parent)}
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True, env=env
    ).stdout


def initialised_repo(path: Path) -> Path:
    """`git init -b main`, `conveyor init`, one commit, in `path`."""
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    assert cli(path, "init").returncode == 0
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


def add_workflow(repo: Path, source: str) -> None:
    (repo / ".conveyor" / "workflows" / "extra.py").write_text(textwrap.dedent(source))
    assert cli(repo, "compile").returncode == 0
