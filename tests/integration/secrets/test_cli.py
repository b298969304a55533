"""`conveyor admin secret|environment|variable` against a real server: no value is ever printed."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.secrets.conftest import KEY_A
from tests.integration.secrets.dumps import dump_database, leaked
from tests.support.cli import invoke
from tests.support.processes import ServerProcess, run_cli

pytestmark = pytest.mark.slow

FROM_STDIN = "stdin-secret-9f8e7d6c5b4a"
FROM_FILE = "file-secret-0a1b2c3d4e5f\n"
FROM_ENV = "env-secret-112233445566"
VALUES = [FROM_STDIN, FROM_FILE.strip(), FROM_ENV]


@pytest.fixture
def running(database_url: str, tmp_path: Path) -> Iterator[tuple[ServerProcess, dict[str, str]]]:
    server = ServerProcess(tmp_path / "home", database_url=database_url, env={"CONVEYOR_SECRET_KEY": KEY_A})
    try:
        server.wait_ready(timeout=90)
        yield server, {"CONVEYOR_URL": server.url, "CONVEYOR_TOKEN": server.owner_token()}
    finally:
        server.stop()


class Outcome:
    """What one CLI invocation printed and returned."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def admin(
    env: dict[str, str], *args: str, input_text: str | None = None, extra_env: dict[str, str] | None = None
) -> Outcome:
    """`conveyor admin ARGS` in this process (fast), against the real server; asserts no value shows."""
    result = invoke(["admin", *args], env={**env, **(extra_env or {})}, input_text=input_text)
    done = Outcome(result.exit_code, result.stdout, result.stderr)
    for value in VALUES:
        assert value not in done.stdout and value not in done.stderr, (args, done.stdout, done.stderr)
    return done


def test_secrets_are_set_from_stdin_a_file_or_the_environment_and_never_printed(
    running: tuple[ServerProcess, dict[str, str]], database_url: str, tmp_path: Path
) -> None:
    server, env = running
    value_file = tmp_path / "value.txt"
    value_file.write_text(FROM_FILE)

    assert (
        admin(env, "environment", "set", "prod", "--var", "REGION=eu", "--allow-branch", "main").returncode
        == 0
    )
    # One real process, so stdin is read exactly as an operator's pipe delivers it.
    done = run_cli(["admin", "secret", "set", "org", "FROM_STDIN"], env=env, input_text=FROM_STDIN)
    assert done.returncode == 0, done.stderr
    assert FROM_STDIN not in done.stdout + done.stderr
    assert "set org FROM_STDIN (key version 1)" in done.stdout
    assert (
        admin(env, "secret", "set", "env/prod", "FROM_FILE", "--value-file", str(value_file)).returncode == 0
    )
    done = admin(
        env,
        "secret",
        "set",
        "source:s1",
        "webhook_secret",
        "--from-env",
        "MY_VALUE",
        extra_env={"MY_VALUE": FROM_ENV},
    )
    assert done.returncode == 0, done.stderr

    listed = admin(env, "secret", "list")
    assert listed.returncode == 0
    assert (
        "FROM_STDIN" in listed.stdout and "FROM_FILE" in listed.stdout and "webhook_secret" in listed.stdout
    )
    # Who updated each: the owner token's label, not its id.
    assert "bootstrap owner" in listed.stdout
    as_json = json.loads(admin(env, "secret", "list", "env/prod", "--json").stdout)
    assert [(i["scope"], i["name"]) for i in as_json["items"]] == [("env/prod", "FROM_FILE")]
    assert "value" not in as_json["items"][0]

    status = admin(env, "secret", "rotation-status")
    assert status.returncode == 0 and "current_version" in status.stdout
    rotated = json.loads(admin(env, "--json", "secret", "rotate-key").stdout)
    assert rotated == {"version": 1, "reencrypted": {"secrets": 0}, "remaining": 0}

    dump = dump_database(database_url)
    assert leaked(dump, VALUES) == []
    assert leaked(server.output(), VALUES) == []

    assert admin(env, "secret", "rm", "org", "FROM_STDIN", "--yes").returncode == 0
    assert admin(env, "secret", "rm", "org", "FROM_STDIN", "--yes").returncode == 4


def test_a_value_is_never_taken_from_an_argument_and_conflicting_sources_are_refused(
    running: tuple[ServerProcess, dict[str, str]], tmp_path: Path
) -> None:
    _, env = running
    as_argument = admin(env, "secret", "set", "org", "X", FROM_STDIN)
    assert as_argument.returncode == 2 and "never taken from an argument" in as_argument.stderr
    value_file = tmp_path / "v"
    value_file.write_text("x")
    both = admin(env, "secret", "set", "org", "X", "--value-file", str(value_file), "--from-env", "HOME")
    assert both.returncode == 2 and "not both" in both.stderr
    missing = admin(env, "secret", "set", "org", "X", "--from-env", "NOT_SET_ANYWHERE_123")
    assert missing.returncode == 2
    bad_scope = admin(env, "secret", "set", "team", "X", input_text="v")
    assert bad_scope.returncode == 2 and "invalid_scope" in bad_scope.stderr
    assert admin(env, "secret", "rm", "org", "X").returncode == 2  # no TTY, no --yes


def test_environments_and_variables_round_trip_through_the_cli(
    running: tuple[ServerProcess, dict[str, str]],
) -> None:
    _, env = running
    assert admin(env, "environment", "set", "prod", "--var", "REGION=eu", "--var", "URL=a=b").returncode == 0
    shown = json.loads(admin(env, "environment", "show", "prod", "--json").stdout)
    assert shown["variables"] == {"REGION": "eu", "URL": "a=b"} and shown["allowed_branches"] == []
    assert (
        admin(
            env, "environment", "set", "prod", "--allow-branch", "main", "--allow-branch", "release/*"
        ).returncode
        == 0
    )
    shown = json.loads(admin(env, "environment", "show", "prod", "--json").stdout)
    assert shown["variables"] == {"REGION": "eu", "URL": "a=b"}
    assert shown["allowed_branches"] == ["main", "release/*"]
    assert "prod" in admin(env, "environment", "list").stdout
    assert admin(env, "environment", "set", "prod", "--var", "broken").returncode == 2
    assert admin(env, "environment", "rm", "prod", "--yes").returncode == 0
    assert admin(env, "environment", "show", "prod").returncode == 4

    assert admin(env, "variable", "set", "TEAM", "ci").returncode == 0
    listed = admin(env, "variable", "list")
    assert "TEAM" in listed.stdout and "ci" in listed.stdout
    assert admin(env, "variable", "rm", "TEAM", "--yes").returncode == 0
    assert json.loads(admin(env, "variable", "list", "--json").stdout)["items"] == []
