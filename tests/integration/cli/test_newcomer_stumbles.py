"""The stumbles of a first run, against real `conveyor up` processes on both databases."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.support.http import HTTP
from tests.support.processes import ServerProcess, clean_environ, conveyor_command, free_port, run_cli
from tests.support.repos import GIT_ENV_ARGS, git
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

HOST = "conveyor:os:linux"


def workflow_source(branch: str, command: str) -> str:
    return textwrap.dedent(
        f"""
        from conveyor import push, workflow

        ci = workflow("ci", on=[push(branches=["{branch}"])])


        @ci.job(runs_on=["{HOST}"], timeout="5m")
        def check(ctx):
            ctx.sh({command})
        """
    )


def commit_workflow(repo: Path, source: str, message: str) -> str:
    (repo / ".conveyor" / "workflows" / "ci.py").write_text(source)
    compiled = run_cli(["compile", "--dir", str(repo)])
    assert compiled.returncode == 0, compiled.stderr
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def runs(server: ServerProcess, token: str) -> list[dict[str, object]]:
    answer = HTTP.get(
        f"{server.url}/api/v1/admin/runs", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    items: list[dict[str, object]] = answer.json()["items"]
    return items


def test_a_master_repository_is_explained_and_a_failed_run_exits_5(database_url: str, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "master")
    init = run_cli(["init", "--dir", str(repo)])
    assert init.returncode == 0, init.stderr
    assert 'push(branches=["master"])' in (repo / ".conveyor" / "workflows" / "ci.py").read_text()

    server = ServerProcess(tmp_path / "home", database_url=database_url, command="up")
    try:
        server.wait_ready()
        token = server.owner_token()
        env = {"CONVEYOR_URL": server.url, "CONVEYOR_TOKEN": token}
        added = run_cli(
            ["admin", "source", "add", "--type", "local", "--name", "app", "--path", str(repo)], env=env
        )
        assert added.returncode == 0, added.stderr

        # A workflow that listens on `main` only: trigger-local says why nothing ran, and exits 5.
        commit_workflow(repo, workflow_source("main", '["true"]'), "main only")
        unmatched = run_cli(["admin", "source", "trigger-local", "app", "--repo", str(repo)], env=env)
        assert unmatched.returncode == 5, unmatched.stdout + unmatched.stderr
        assert "no run started" in unmatched.stdout
        assert "'master' matches none of glob 'main'" in unmatched.stdout
        no_wait = run_cli(
            ["admin", "source", "trigger-local", "app", "--repo", str(repo), "--no-wait"], env=env
        )
        assert no_wait.returncode == 0 and no_wait.stdout.startswith("accepted"), no_wait.stdout
        assert "no run started" not in no_wait.stdout
        assert runs(server, token) == []

        # A failing job: trigger-local prints the run; `run logs --follow` ends on its status and exits 5.
        commit_workflow(repo, workflow_source("master", '["false"]'), "failing")
        started = run_cli(["admin", "source", "trigger-local", "app", "--repo", str(repo)], env=env)
        assert started.returncode == 0, started.stdout + started.stderr
        run_ids = re.findall(r"started run (\S+)", started.stdout)
        assert [r["id"] for r in runs(server, token)] == run_ids
        followed = run_cli(["admin", "run", "logs", run_ids[0], "--follow"], env=env, timeout=240)
        assert followed.returncode == 5, followed.stdout + followed.stderr
        assert (
            followed.stdout.rstrip().splitlines()[-1]
            == "run #1 ci did not succeed: failed (check: step_failed: check)"
        )

        # install-hook --on commit: a local commit starts a run of HEAD; the hook never fails the commit.
        hook = run_cli(
            ["admin", "source", "install-hook", "app", "--repo", str(repo), "--on", "commit"], env=env
        )
        assert hook.returncode == 0, hook.stderr
        assert (repo / ".git" / "hooks" / "post-commit").is_file()
        source = workflow_source("master", '["true"]')
        (repo / ".conveyor" / "workflows" / "ci.py").write_text(source)
        assert run_cli(["compile", "--dir", str(repo)]).returncode == 0
        git(repo, "add", "-A")
        committed = subprocess.run(
            ["git", *GIT_ENV_ARGS, "-C", str(repo), "commit", "-q", "-m", "passing"],
            env=clean_environ(env),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert committed.returncode == 0, committed.stderr
        head = git(repo, "rev-parse", "HEAD")
        newest = wait_until(
            lambda: next((r for r in runs(server, token) if r["sha"] == head), None),
            timeout=60,
            what="the post-commit hook's run",
        )
        passed = run_cli(["admin", "run", "logs", str(newest["id"]), "--follow"], env=env, timeout=240)
        assert passed.returncode == 0, passed.stdout + passed.stderr
        assert passed.stdout.rstrip().splitlines()[-1] == "run #2 ci succeeded"
    finally:
        server.stop()


def test_init_outside_a_git_repository_warns(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    done = run_cli(["init", "--dir", str(plain)])
    assert done.returncode == 0, done.stderr
    assert "warning:" in done.stderr and "not a git repository" in done.stderr


def test_a_second_server_on_a_held_home_exits_2_at_once_and_a_crashed_one_does_not_delay_the_next(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    first = ServerProcess(home, command="up", env={"CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": "10000"})
    try:
        first.wait_ready()
        second = subprocess.run(
            conveyor_command("up", "--port", str(free_port())),
            env=clean_environ({"CONVEYOR_HOME": str(home)}),
            capture_output=True,
            text=True,
            timeout=30,  # the stale window is 30 s: a refusal within it did not wait for it
        )
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert f"pid {first.proc.pid}" in lines[0] and first.url in lines[0]
        assert "listening" not in second.stderr

        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        for name in ("conveyor.db", "conveyor.db-wal", "conveyor.db-shm", "secret.key"):
            assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name
        assert f"generated a new secret key in {home / 'secret.key'}" in first.output()
    finally:
        first.kill()
    # The crashed process's instance row is live for 30 s more; the free home lock says it is dead.
    again = ServerProcess(home, command="up", env={"CONVEYOR_CLUSTER_HEARTBEAT_INTERVAL_MS": "10000"})
    try:
        again.wait_ready(timeout=25)
        assert "waiting for a conflicting instance row" not in again.output()
    finally:
        again.stop()


def test_a_taken_port_is_refused_in_one_line_before_anything_is_created(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            conveyor_command("up", "--port", str(port)),
            env=clean_environ({"CONVEYOR_HOME": str(home)}),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"127.0.0.1:{port} is already in use" in lines[0]
    assert "--port" in lines[0] and "CONVEYOR_PORT" in lines[0]
    assert "listening on" not in done.stderr and "cvy_admin_" not in done.stderr
    # No database, secret key or owner token was made for a server that never started.
    assert not home.exists(), sorted(p.name for p in home.iterdir())


def test_up_prints_the_local_scalers_limit_and_how_to_change_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = ServerProcess(home, command="up")  # JSON logs: the notice is a plain line all the same
    try:
        server.wait_listening()
        wait_until(lambda: "built-in local scaler" in server.output(), timeout=30, what="the scaler notice")
        notice = server.output().split("built-in local scaler", 1)[1]
        assert re.match(r": at most (?:[2-9]|\d{2,}) jobs at once", notice), notice
        assert str(home / "scalers.yaml") in notice and "max_agents" in notice
    finally:
        server.stop()


def test_a_cut_admin_token_is_called_malformed(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "home", command="up")
    try:
        server.wait_ready()
        token = server.owner_token()
        done = run_cli(
            ["admin", "run", "list"], env={"CONVEYOR_URL": server.url, "CONVEYOR_TOKEN": token[:30]}
        )
        assert done.returncode == 3
        assert "malformed" in done.stderr and "not an admin token" not in done.stderr
        assert "Traceback" not in done.stderr
        listed = run_cli(
            ["admin", "--json", "run", "list"], env={"CONVEYOR_URL": server.url, "CONVEYOR_TOKEN": token}
        )
        assert json.loads(listed.stdout)["items"] == []
    finally:
        server.stop()
    assert os.path.exists(tmp_path / "home" / "server.lock")
