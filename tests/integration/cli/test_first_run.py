"""The README's first run, typed as a new user would: a fresh shell without the venv on PATH, a new
`master` repository, the `make run` server (`conveyor up`) in another "terminal"."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import ServerProcess

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent


def readme_first_run_block() -> list[str]:
    """The shell lines of README.md's "A first run" block."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## A first run", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def fresh_shell_env(home: Path) -> dict[str, str]:
    """What a new terminal has: a PATH without the venv, no CONVEYOR_* and no virtualenv."""
    path = ":".join(
        p
        for p in os.environ.get("PATH", "/usr/bin:/bin").split(":")
        if p and Path(p).resolve() != VENV_BIN.resolve()
    )
    # PYTHONPATH, when the test run sets one, only chooses which source tree the venv's `conveyor` runs.
    passthrough = {k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}
    return {
        **passthrough,
        "PATH": path,
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "GIT_AUTHOR_NAME": "New User",
        "GIT_AUTHOR_EMAIL": "new@example.com",
        "GIT_COMMITTER_NAME": "New User",
        "GIT_COMMITTER_EMAIL": "new@example.com",
        "GIT_CONFIG_NOSYSTEM": "1",
    }


def test_the_readme_first_run_block_works_as_written_on_a_master_repository(tmp_path: Path) -> None:
    lines = readme_first_run_block()
    assert lines[0].startswith("export PATH=") and "/path/to/conveyor/.venv/bin" in lines[0]
    assert any("<RUN>" in line for line in lines)
    user_home = tmp_path / "user"
    user_home.mkdir()
    env = fresh_shell_env(user_home)
    # `conveyor` must not already be on the new terminal's PATH: the README's first line puts it there.
    which = subprocess.run(["bash", "-c", "command -v conveyor"], env=env, capture_output=True, text=True)
    assert which.returncode != 0, which.stdout

    repo = tmp_path / "my-repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "master", str(repo)], check=True, env=env)
    (repo / "README.md").write_text("my project\n")

    server = ServerProcess(tmp_path / "conveyor-home", command="up")
    try:
        server.wait_ready()
        token = server.owner_token()
        filled = [
            line.replace("/path/to/conveyor", str(REPO_ROOT))
            .replace("http://127.0.0.1:8470", server.url)
            .replace("cvy_admin_…", token)
            for line in lines
        ]
        # Everything up to the line that needs the run id, then that line with the id trigger-local printed.
        upto = next(i for i, line in enumerate(filled) if "<RUN>" in line)
        first = subprocess.run(
            ["bash", "-e", "-c", "\n".join(filled[:upto])],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert first.returncode == 0, first.stdout + first.stderr
        started = re.findall(r"started run (\S+)", first.stdout)
        assert len(started) == 1, first.stdout
        assert "runs on pushes to master" in first.stdout
        last = subprocess.run(
            [
                "bash",
                "-e",
                "-c",
                "\n".join([filled[0], "cd my-repo", filled[upto].replace("<RUN>", started[0])]),
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert last.returncode == 0, last.stdout + last.stderr
        assert started[0] in last.stdout  # run list prints whole ids when not on a terminal
        assert last.stdout.rstrip().splitlines()[-1] == "run #1 ci succeeded"
    finally:
        server.stop()
