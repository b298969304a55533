"""A fresh clone, walked as the docs say: `make run` and the README's first run, then docs/cluster.md's
two coordinators and a worker, each command typed as written (only what a reader fills in is filled in).

The clone is of this checkout's committed HEAD, and its docs are the ones walked; `make` installs it
into the clone's own `.venv` once for both walks.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from tests.support import postgres
from tests.support.docs_walk import (
    Background,
    Terminal,
    fresh_shell_env,
    logical_commands,
    sh_blocks,
    walk_readme_first_run,
)
from tests.support.http import HTTP
from tests.support.processes import TOKEN_PATTERN, free_port
from tests.support.waiting import wait_until

# One group: both walks share the module's clone and its `make` install (about 100 s), done once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fresh-clone")]

REPO_ROOT = Path(__file__).resolve().parents[2]
TEST_VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`git clone` of this checkout, with `make run`'s own install step done (`.venv/.installed`)."""
    root = tmp_path_factory.mktemp("fresh-clone") / "conveyor"
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(root)], check=True, timeout=120)
    # The test run's own environment (its pip configuration, caches and proxy), without its venv.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith("CONVEYOR_") and k not in ("VIRTUAL_ENV", "PYTHONPATH")
    }
    env["PATH"] = fresh_shell_env(root, strip=TEST_VENV_BIN)["PATH"]
    done = subprocess.run(
        ["make", "-C", str(root), ".venv/.installed"], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return root


@pytest.fixture
def user_home(tmp_path: Path) -> Path:
    home = tmp_path / "user"
    home.mkdir()
    return home


def test_make_run_and_the_readme_first_run_from_a_fresh_clone(
    clone: Path, user_home: Path, tmp_path: Path
) -> None:
    env = fresh_shell_env(user_home, strip=TEST_VENV_BIN)
    port = free_port()
    # `make run` in its terminal; its default port may be taken on a shared machine, so CONVEYOR_PORT moves it.
    server = Background(
        "make run",
        env={**env, "CONVEYOR_PORT": str(port)},
        cwd=clone,
        log=tmp_path / "make-run.log",
        url=f"http://127.0.0.1:{port}",
    )
    try:
        server.wait_until(
            lambda: _answers(server.url + "/ready"), what="make run's server to be ready", timeout=180
        )
        printed = server.output()
        # What `make run` tells the reader to type first is the README's first line, filled in.
        assert f'export PATH="{clone}/.venv/bin:$PATH"' in printed, printed
        (token,) = set(TOKEN_PATTERN.findall(printed))
        walk_readme_first_run(clone, server_url=server.url, token=token, workdir=tmp_path, env=env)
    finally:
        server.stop()


def test_the_cluster_walkthrough_of_two_coordinators_and_a_worker_from_a_fresh_clone(
    clone: Path, user_home: Path, tmp_path: Path
) -> None:
    text = (clone / "docs/cluster.md").read_text(encoding="utf-8")
    blocks = sh_blocks(text, "## Try it on one machine: two coordinators and a worker")
    assert len(blocks) >= 5, blocks
    env = fresh_shell_env(user_home, strip=TEST_VENV_BIN)
    env["PATH"] = f"{clone / '.venv' / 'bin'}:{env['PATH']}"  # "conveyor on your PATH (see the README)"
    database = postgres.new_database_name("walk_")
    server = make_url(postgres.server_url())
    base = f"postgresql://{server.username or 'postgres'}@{server.host or '127.0.0.1'}:{server.port or 5432}"
    ports = {doc: str(free_port()) for doc in ("8471", "8472", "8473")}
    filled: dict[str, str] = {}

    def fill(command: str) -> str:
        command = command.replace("postgresql://postgres@127.0.0.1:5432", base).replace(
            "conveyor_demo", database
        )
        for doc, real in ports.items():
            command = command.replace(doc, real)
        for placeholder, value in filled.items():
            command = command.replace(placeholder, value)
        unfilled = re.findall(r"cvy_\w+_…|<RUN>", re.sub(r"(^|\s)#.*", "", command))  # not in comments
        assert not unfilled, f"nothing printed earlier fills {unfilled} in `{command}`"
        return command

    terminal = Terminal(tmp_path, env, cwd=user_home)
    servers: list[Background] = []
    try:
        for index, block in enumerate(blocks):
            if "conveyor server" in block:
                node = Background(fill(block), env=env, cwd=user_home, log=tmp_path / f"server-{index}.log")
                servers.append(node)
                # What a reader waits for before typing on: each node healthy (a worker: connected to every
                # coordinator; a coordinator: to every peer it knows, with a leader).
                for started in servers:
                    started.wait_until(
                        lambda s=started: s.health() == "healthy", what=f"{started.url} healthy"
                    )
                if not filled.get("cvy_admin_…"):
                    (filled["cvy_admin_…"],) = set(TOKEN_PATTERN.findall(node.output()))
                continue
            for command in logical_commands(block):
                output = terminal.run(fill(command))
                if join := re.search(r"\bcvy_join_\S+", output):
                    filled["cvy_join_…"] = join.group(0)
                if run := re.search(r"started run (\S+)", output):
                    filled["<RUN>"] = run.group(1)
        transcript = terminal.output
        assert re.search(r"^status\s+healthy$", transcript, re.MULTILINE), transcript
        assert "run #1 ci succeeded" in transcript, transcript
        worker_id = (user_home / "cvy" / "w1" / "instance-id").read_text().strip()
        assert re.search(rf"\bon {worker_id} hop 1\b", transcript), transcript
    finally:
        for node in reversed(servers):  # the worker first, as the doc says
            node.stop()
        postgres.drop_database(database)
    # Every server left cleanly; nothing it started is still running.
    for node in servers:
        assert node.proc.returncode == 0 or node.proc.returncode == -signal.SIGTERM, node.output()


def _answers(url: str) -> bool:
    try:
        return HTTP.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(autouse=True)
def _no_leftover_processes(clone: Path) -> Iterator[None]:
    """Processes of the clone's venv (servers, spawned agents) end with the test that started them."""
    yield

    def none_left() -> bool:
        found = subprocess.run(["pgrep", "-f", str(clone / ".venv")], capture_output=True, text=True)
        return not found.stdout.strip()

    wait_until(none_left, timeout=30, what="the clone's processes to end")
