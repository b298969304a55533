"""The README's first run, typed as a new user would: a fresh shell without the venv on PATH, a new
`master` repository, the `make run` server (`conveyor up`) in another "terminal"."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.docs_walk import fresh_shell_env, walk_readme_first_run
from tests.support.processes import ServerProcess

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent


def test_the_readme_first_run_block_works_as_written_on_a_master_repository(tmp_path: Path) -> None:
    user_home = tmp_path / "user"
    user_home.mkdir()
    server = ServerProcess(tmp_path / "conveyor-home", command="up")
    try:
        server.wait_ready()
        walk_readme_first_run(
            REPO_ROOT,
            server_url=server.url,
            token=server.owner_token(),
            workdir=tmp_path,
            env=fresh_shell_env(user_home, strip=VENV_BIN),
        )
    finally:
        server.stop()
