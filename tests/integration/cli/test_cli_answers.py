"""What the CLI answers, against real processes: `--version`, shell completion, `run start`, `run show`'s
decision trace, `admin cluster health`, and a URL that is not a Conveyor."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.version import VERSION
from tests.support.processes import ServerProcess, free_port, run_cli
from tests.support.repos import PUSH_WORKFLOW, make_repo
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def test_version_prints_the_builds_version() -> None:
    done = run_cli(["--version"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"conveyor {VERSION}"


def test_bash_completion_is_served_and_completes_admin_groups(tmp_path: Path) -> None:
    script = run_cli([], env={"_CONVEYOR_COMPLETE": "source_bash"})
    assert script.returncode == 0, script.stdout + script.stderr
    assert "complete" in script.stdout and "_conveyor_completion" in script.stdout
    # What bash asks the program when the user presses TAB after `conveyor admin ru`.
    words = run_cli(
        [], env={"_CONVEYOR_COMPLETE": "complete_bash", "COMP_WORDS": "conveyor admin ru", "COMP_CWORD": "2"}
    )
    assert words.stdout.split() == ["run"], words.stdout + words.stderr
    installed = run_cli(["--install-completion", "bash"], env={"HOME": str(tmp_path), "SHELL": "/bin/bash"})
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "conveyor" in (tmp_path / ".bashrc").read_text()


def test_a_url_that_is_not_a_conveyor_is_named_in_one_line_without_its_page(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text(
        "<html><head><title>Some Other Site</title></head><body>hi</body></html>"
    )
    port = free_port()
    web = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _accepts(port), timeout=10, what="the web server")
        for args in (["run", "list"], ["cluster", "health"]):
            done = run_cli(["admin", "--url", url, "--token", "cvy_admin_" + "0" * 64, *args])
            assert done.returncode == 1, done.stdout + done.stderr
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1, done.stderr
            assert f"{url} is not a Conveyor admin API" in lines[0]
            assert "HTTP 404" in lines[0] and "text/html" in lines[0] and "SimpleHTTP" in lines[0]
            assert "<html" not in done.stderr and "Traceback" not in done.stderr
        # A page that answers 200 with HTML is no Conveyor either.
        (tmp_path / "api" / "v1" / "admin").mkdir(parents=True)
        (tmp_path / "api" / "v1" / "admin" / "runs").write_text("<html><title>Some Other Site</title></html>")
        done = run_cli(["admin", "--url", url, "--token", "cvy_admin_" + "0" * 64, "run", "list"])
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert "HTTP 200" in done.stderr and "'Some Other Site'" in done.stderr
    finally:
        web.terminate()
        web.wait(timeout=10)


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def running(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("answers")
    repo = make_repo(base / "repo", {"ci": PUSH_WORKFLOW})
    server = ServerProcess(base / "home", database_url=module_database_url)
    try:
        server.wait_ready()
        env = {"CONVEYOR_URL": server.url, "CONVEYOR_TOKEN": server.owner_token()}
        added = run_cli(
            ["admin", "source", "add", "--type", "local", "--name", "app", "--path", str(repo)], env=env
        )
        assert added.returncode == 0, added.stderr
        yield {"env": env, "server": server}
    finally:
        server.stop()


def test_run_start_prints_started_run_like_trigger_local(running: dict[str, Any]) -> None:
    done = run_cli(
        ["admin", "run", "start", "--source", "app", "--workflow", "ci", "--input", "target=prod"],
        env=running["env"],
    )
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"started run \S+\n", done.stdout), done.stdout


def test_run_show_renders_the_decision_trace_as_preview_does(running: dict[str, Any]) -> None:
    env = running["env"]
    started = run_cli(
        ["admin", "run", "start", "--source", "app", "--workflow", "ci", "--input", "target=qa"], env=env
    )
    run_id = started.stdout.split()[-1]
    shown = run_cli(["admin", "run", "show", run_id], env=env)
    assert shown.returncode == 0, shown.stderr
    trace = shown.stdout.split("why it ran:", 1)[1]
    assert re.search(r"^event dispatch on main at [0-9a-f]{12}", trace, re.MULTILINE), trace
    assert "MATCHED  ci  (trigger 1)" in trace
    assert "    trigger 1 dispatch: matched" in trace
    assert "    trigger 0 push: not matched" in trace and "NO  type: event type is dispatch" in trace
    assert '"triggers"' not in shown.stdout  # not the raw JSON
    as_json = json.loads(run_cli(["admin", "run", "show", run_id, "--json"], env=env).stdout)
    assert as_json["trigger_trace"]["workflow"]["matched_trigger"] == 1


def test_cluster_health_answers_the_nodes_status_and_exits_0_when_healthy(running: dict[str, Any]) -> None:
    env = running["env"]
    done = run_cli(["admin", "cluster", "health"], env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^status\s+healthy$", done.stdout, re.MULTILINE), done.stdout
    assert re.search(r"^role\s+coordinator$", done.stdout, re.MULTILINE), done.stdout
    body = json.loads(run_cli(["admin", "cluster", "health", "--json"], env=env).stdout)
    assert body["status"] == "healthy" and body["role"] == "coordinator"


def test_source_add_sets_what_a_fork_pull_request_gets(running: dict[str, Any], tmp_path: Path) -> None:
    secret = tmp_path / "webhook-secret"
    secret.write_text("s3cret-for-forks\n")
    base = ["admin", "source", "add", "--type", "github", "--repo", "acme/forks", "--json"]
    base += ["--webhook-secret-file", str(secret)]
    added = run_cli([*base, "--name", "forks", "--fork-pull-requests", "refuse"], env=running["env"])
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["fork_pull_requests"] == "refuse"
    refused = run_cli([*base, "--name", "forks2", "--fork-pull-requests", "sometimes"], env=running["env"])
    assert refused.returncode == 2 and "fork_pull_requests" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
