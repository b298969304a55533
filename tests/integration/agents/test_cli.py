"""`conveyor admin agent …` and `queue …` against a real server process.

The two behaviours the brief names run the CLI as a real process; the other verbs run in this
process (typer's runner) against the same server, which is quicker and exercises the same code.
"""

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import invoke
from tests.support.processes import ServerProcess, run_cli

pytestmark = pytest.mark.slow

AGENT_TOKEN = re.compile(r"cvy_agent_[0-9a-f]{64}")


@pytest.fixture
def running(database_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    server = ServerProcess(tmp_path / "home", database_url=database_url)
    try:
        server.wait_ready(timeout=90)
        yield {"CONVEYOR_URL": server.url, "CONVEYOR_TOKEN": server.owner_token()}
    finally:
        server.stop()


def admin(env: dict[str, str], *args: str) -> Any:
    """`conveyor admin ARGS` in this process (stdin is not a terminal)."""
    return invoke(["admin", *args], env=env)


def test_agent_token_create_prints_the_token_once_and_list_never_shows_it(running: dict[str, str]) -> None:
    created = run_cli(
        [
            "admin",
            "agent",
            "token",
            "create",
            "--labels",
            "linux,Docker",
            "--label",
            "fleet",
            "--mandatory-label",
            "docker",
        ],
        env=running,
    )
    assert created.returncode == 0, created.stderr
    found = AGENT_TOKEN.findall(created.stdout + created.stderr)
    assert len(found) == 1, created.stdout
    assert "not shown again" in created.stderr

    listed = admin(running, "agent", "token", "list", "--json")
    assert listed.exit_code == 0, listed.output
    assert found[0] not in listed.stdout
    [item] = json.loads(listed.stdout)["items"]
    assert (item["label"], item["labels"], item["mandatory_labels"]) == (
        "fleet",
        ["docker", "linux"],
        ["docker"],
    )
    assert item["prefix"] == found[0][:12]

    assert admin(running, "agent", "token", "revoke", item["id"], "--yes").exit_code == 0
    again = admin(running, "agent", "token", "revoke", item["id"], "--yes")
    assert again.exit_code == 1 and "(conflict, HTTP 409)" in again.stderr


def test_queue_clear_without_a_terminal_or_yes_exits_2(running: dict[str, str]) -> None:
    refused = run_cli(["admin", "queue", "clear"], env=running)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert "--yes" in refused.stderr

    for args in (["agent", "token", "revoke", "some-id"], ["agent", "disconnect", "a1"]):
        assert admin(running, *args).exit_code == 2, args
    cleared = admin(running, "queue", "clear", "--yes")
    assert cleared.exit_code == 0, cleared.output
    assert "cancelled 0 queued job(s)" in cleared.stdout

    assert admin(running, "queue", "list").exit_code == 0
    assert admin(running, "agent", "list", "--label", "linux").exit_code == 0
    missing = admin(running, "agent", "show", "nope")
    assert missing.exit_code == 4 and "(not_found, HTTP 404)" in missing.stderr
    assert admin(running, "queue", "show", "nope").exit_code == 4


def test_a_list_cut_by_limit_says_where_the_next_page_starts_and_cursor_reads_it(
    running: dict[str, str],
) -> None:
    for label in ("first", "second"):
        assert (
            admin(running, "agent", "token", "create", "--labels", "linux", "--label", label).exit_code == 0
        )
    first = admin(running, "agent", "token", "list", "--limit", "1")
    assert first.exit_code == 0, first.output
    (cursor,) = re.findall(r"next: --cursor (\S+)", first.stdout)
    second = admin(running, "agent", "token", "list", "--limit", "1", "--cursor", cursor)
    assert second.exit_code == 0, second.output
    assert "next: --cursor" not in second.stdout  # the last page
    shown = {label for label in ("first", "second") if label in first.stdout or label in second.stdout}
    assert shown == {"first", "second"} and ("first" in first.stdout) != ("first" in second.stdout)
    every = json.loads(admin(running, "agent", "token", "list", "--all", "--json").stdout)
    assert len(every["items"]) == 2 and every["next_cursor"] is None
