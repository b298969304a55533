"""`conveyor agent`: run jobs for an orchestrator (docs/design/execution.md §7).

Exit codes: 0 after a drain, a signal or an ephemeral agent's job; 2 usage (no URL or token, a `conveyor:`
label, an unreadable token file); 3 the orchestrator refused the agent (4010 auth failed, 4003 protocol
unsupported, 4008 replaced by a newer connection with the same agent id) or its claim code (unknown,
used or expired).

`--claim CODE --url URL` is how a machine provisioned for an `event` scaler joins
(docs/design/scaler.md §6.4): the code is redeemed at `URL/api/v1/agents/claim` for the spawn's agent id,
token and labels, the answer is kept in `<home>/claim.json` (mode 0600), and the agent registers with them as
a one-job agent.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

import typer

EXIT_USAGE = 2
EXIT_REFUSED = 3
CLAIM_FILE = "claim.json"


def claim_base_url(url: str) -> str:
    """The HTTP base a claim is redeemed at, from `http(s)://HOST:PORT[/]` or `ws(s)://HOST:PORT/ws`."""
    parts = urlsplit(url.strip())
    scheme = {"ws": "http", "wss": "https", "http": "http", "https": "https"}.get(parts.scheme.lower())
    if scheme is None or not parts.netloc:
        raise ValueError(f"--url must be http(s)://HOST:PORT or ws(s)://HOST:PORT/ws, got {url!r}")
    path = parts.path.rstrip("/")
    if path.endswith("/ws"):
        path = path[: -len("/ws")]
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def redeem_claim(code: str, url: str, home: Path) -> dict[str, Any]:
    """POST the code; save and return `{agent_id, token, url, labels, …}`. Raises `typer.Exit`."""
    import httpx

    try:
        base = claim_base_url(url)
    except ValueError as error:
        raise _fail(str(error)) from None
    try:
        response = httpx.post(f"{base}/api/v1/agents/claim", json={"claim_code": code}, timeout=30)
    except httpx.HTTPError as error:
        raise _fail(f"cannot reach {base} to redeem the claim: {error}") from None
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code != 200 or not isinstance(body, dict):
        detail = body.get("detail") if isinstance(body, dict) else None
        typer.echo(
            f"error: the claim was refused ({response.status_code}): {detail or response.text[:200]}",
            err=True,
        )
        raise typer.Exit(EXIT_REFUSED if response.status_code == 401 else EXIT_USAGE)
    home.mkdir(parents=True, exist_ok=True)
    saved = home / CLAIM_FILE
    descriptor = os.open(saved, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(body, handle)
    return body


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


def _bytes_env(name: str, default: int) -> int:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise _fail(f"{name} must be a whole number of bytes (0 turns the mirrors off), got {value!r}")
    return number


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
    claim: Annotated[
        str | None,
        typer.Option(
            "--claim",
            envvar="CONVEYOR_AGENT_CLAIM",
            help="Redeem this event-scaler claim code at --url (the orchestrator's HTTP URL), then run its job.",
        ),
    ] = None,
) -> None:
    """Connect to an orchestrator and run the jobs it dispatches."""
    _run_agent(
        url=url,
        token=token,
        token_file=token_file,
        labels=labels,
        capacity=capacity,
        home=home,
        agent_id=agent_id,
        ephemeral=ephemeral,
        keep_workspace=keep_workspace,
        claim=claim,
    )


def _run_agent(
    *,
    url: str | None,
    token: str | None,
    token_file: Path | None,
    labels: list[str] | None,
    capacity: int,
    home: Path | None,
    agent_id: str | None,
    ephemeral: bool,
    keep_workspace: bool,
    claim: str | None,
) -> None:
    """`conveyor agent` once typer has read its flags: check them, redeem a claim, run the agent; exits."""
    from conveyor.agent.cache_store import DEFAULT_MAX_BYTES as DEFAULT_CACHE_MAX_BYTES
    from conveyor.agent.identity import agent_labels, parse_labels
    from conveyor.agent.mirror import DEFAULT_MAX_BYTES
    from conveyor.agent.program import Agent, AgentOptions
    from conveyor.server.logs import configure_logging

    if not url:
        raise _fail("no orchestrator URL: pass --url ws://HOST:PORT/ws or set CONVEYOR_AGENT_URL")
    agent_home = (home.expanduser() if home is not None else default_home()).resolve()
    if claim is not None:
        if token or token_file is not None:
            raise _fail("--claim gives the agent its token: do not pass --token or --token-file with it")
        redeemed = redeem_claim(claim.strip(), url, agent_home)
        url, token = str(redeemed["url"]), str(redeemed["token"])
        agent_id, ephemeral = str(redeemed["agent_id"]), True
        labels = [",".join(str(label) for label in redeemed.get("labels") or [])]
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
        home=agent_home,
        labels=configured,
        capacity=capacity,
        agent_id=agent_id or None,
        ephemeral=ephemeral,
        keep_workspace=keep_workspace,
        heartbeat_s=_ms_env("CONVEYOR_AGENT_HEARTBEAT_MS"),
        dead_after_s=_ms_env("CONVEYOR_AGENT_DEAD_AFTER_MS") or 45.0,
        mirror_max_bytes=_bytes_env("CONVEYOR_AGENT_MIRROR_MAX_BYTES", DEFAULT_MAX_BYTES),
        cache_max_bytes=_bytes_env("CONVEYOR_AGENT_CACHE_MAX_BYTES", DEFAULT_CACHE_MAX_BYTES),
    )

    async def main() -> int:
        return await Agent(options).run()

    import asyncio

    raise typer.Exit(asyncio.run(main()))


def register(app: typer.Typer) -> None:
    """Attach `agent`."""
    app.command("agent")(agent)
