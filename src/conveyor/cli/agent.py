"""`conveyor agent`: run jobs for an orchestrator (execution.md §7).

Exit codes: 0 after a drain, a signal or an ephemeral agent's job; 2 usage (no URL or token, a `conveyor:`
label, an unreadable token file); 3 the orchestrator refused the agent (4010 auth failed, 4003 protocol
unsupported, 4008 replaced by a newer connection with the same agent id).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated

import typer

EXIT_USAGE = 2


def default_home(environ: dict[str, str] | None = None) -> Path:
    """`$CONVEYOR_AGENT_HOME`, else `$CONVEYOR_HOME/agent` (`~/.conveyor/agent`)."""
    env = os.environ if environ is None else environ
    if env.get("CONVEYOR_AGENT_HOME"):
        return Path(env["CONVEYOR_AGENT_HOME"]).expanduser()
    base = Path(env["CONVEYOR_HOME"]).expanduser() if env.get("CONVEYOR_HOME") else Path.home() / ".conveyor"
    return base / "agent"


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_USAGE)


def _ms_env(name: str) -> float | None:
    value = os.environ.get(name)
    if not value:
        return None
    try:
        return max(0.01, int(value) / 1000)
    except ValueError:
        raise _fail(f"{name} must be a number of milliseconds, got {value!r}") from None


def agent(
    url: Annotated[
        str | None,
        typer.Option("--url", envvar="CONVEYOR_AGENT_URL", help="The orchestrator's ws://HOST:PORT/ws."),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option("--token", envvar="CONVEYOR_AGENT_TOKEN", help="Agent token (prefer the environment)."),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file", envvar="CONVEYOR_AGENT_TOKEN_FILE", help="Read the agent token from this file."
        ),
    ] = None,
    labels: Annotated[
        list[str] | None,
        typer.Option("--labels", envvar="CONVEYOR_AGENT_LABELS", help="Comma-separated labels (repeatable)."),
    ] = None,
    capacity: Annotated[
        int,
        typer.Option(
            "--capacity", envvar="CONVEYOR_AGENT_CAPACITY", min=1, max=256, help="Jobs run at once."
        ),
    ] = 1,
    home: Annotated[
        Path | None,
        typer.Option("--home", help="Agent home (default $CONVEYOR_AGENT_HOME, else $CONVEYOR_HOME/agent)."),
    ] = None,
    agent_id: Annotated[
        str | None,
        typer.Option(
            "--agent-id", envvar="CONVEYOR_AGENT_ID", help="Agent id (default: made once in the home)."
        ),
    ] = None,
    ephemeral: Annotated[
        bool,
        typer.Option("--ephemeral", envvar="CONVEYOR_AGENT_EPHEMERAL", help="Run one job, then exit."),
    ] = False,
    keep_workspace: Annotated[
        bool,
        typer.Option(
            "--keep-workspace",
            envvar="CONVEYOR_AGENT_KEEP_WORKSPACE",
            help="Keep the workspace of failed jobs in <home>/work.",
        ),
    ] = False,
) -> None:
    """Connect to an orchestrator and run the jobs it dispatches."""
    from conveyor.agent.identity import agent_labels, parse_labels
    from conveyor.agent.program import Agent, AgentOptions
    from conveyor.server.logs import configure_logging

    if not url:
        raise _fail("no orchestrator URL: pass --url ws://HOST:PORT/ws or set CONVEYOR_AGENT_URL")
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as error:
            raise _fail(f"cannot read the token file {token_file}: {error.strerror}") from None
    if not token:
        raise _fail("no agent token: pass --token-file F, --token T or set CONVEYOR_AGENT_TOKEN")
    configured = parse_labels(labels or [])
    try:
        agent_labels(configured)
    except ValueError as error:
        raise _fail(str(error)) from None
    configure_logging(
        os.environ.get("CONVEYOR_LOG_FORMAT", "auto"), os.environ.get("CONVEYOR_LOG_LEVEL", "info")
    )
    logging.getLogger("websockets").setLevel(logging.WARNING)
    options = AgentOptions(
        url=url,
        token=token,
        home=(home.expanduser() if home is not None else default_home()).resolve(),
        labels=configured,
        capacity=capacity,
        agent_id=agent_id or None,
        ephemeral=ephemeral,
        keep_workspace=keep_workspace,
        heartbeat_s=_ms_env("CONVEYOR_AGENT_HEARTBEAT_MS"),
        dead_after_s=_ms_env("CONVEYOR_AGENT_DEAD_AFTER_MS") or 45.0,
    )

    async def main() -> int:
        return await Agent(options).run()

    import asyncio

    raise typer.Exit(asyncio.run(main()))


def register(app: typer.Typer) -> None:
    """Attach `agent`."""
    app.command("agent")(agent)
