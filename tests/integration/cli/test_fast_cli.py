"""A fast CLI: importing the `conveyor` command loads no server stack and no HTTP client."""

import json
import subprocess
import sys

SERVER_STACK = ("fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "httpx")
# typer itself validates option values through pydantic, so only the bare import is held to this one.
HEAVY = (*SERVER_STACK, "pydantic")


def _loaded_after(statement: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    probe = (
        f"import sys\n{statement}\n"
        f"print(__import__('json').dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r}))))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    loaded: list[str] = json.loads(result.stdout)
    return loaded


def test_importing_the_cli_leaves_the_server_stack_and_httpx_unloaded() -> None:
    assert _loaded_after("import conveyor.cli.main") == []


def test_help_of_every_command_group_loads_no_server_stack() -> None:
    statement = (
        "from typer.testing import CliRunner\n"
        "from conveyor.cli.main import app\n"
        "for args in (['--help'], ['admin', '--help'], ['admin', 'run', 'list', '--help'],"
        " ['admin', 'source', 'trigger-local', '--help'], ['run', 'local', '--help']):\n"
        "    assert CliRunner().invoke(app, args).exit_code == 0, args"
    )
    assert _loaded_after(statement, SERVER_STACK) == []


def test_help_shows_no_type_placeholder_on_flags() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "conveyor", "admin", "source", "trigger-local", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "<bool>" not in result.stdout
    assert "--json" in result.stdout


def test_the_sdk_still_loads_through_the_package() -> None:
    statement = "from conveyor import workflow, push\nimport conveyor\nassert 'workflow' in conveyor.__all__"
    assert "pydantic" not in _loaded_after("import conveyor")
    _loaded_after(statement)


def test_the_agent_program_loads_neither_the_sdk_nor_the_server_stack() -> None:
    """`conveyor agent --ephemeral` is on a cold spawn's path: it imports what an agent needs (issue 19)."""
    statement = "import conveyor.cli.agent, conveyor.agent.program"
    assert _loaded_after(statement, SERVER_STACK) == []
    probe = (
        f"import sys\n{statement}\nfrom conveyor.model import protocol\n"
        "assert not [m for m in sys.modules if m == 'conveyor.sdk' or m.startswith('conveyor.sdk.')], 'sdk'\n"
        "assert protocol.agent_messages.cache_info().currsize == 0, 'the orchestrator-side parser was built'\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
