"""`conveyor admin agent list|show|disconnect` and `agent token create|list|revoke`."""

from __future__ import annotations

from typing import Annotated

import typer

from conveyor.cli.admin.client import (
    AllPagesOption,
    CursorOption,
    JsonFlag,
    LimitOption,
    client_from,
    print_fields,
    print_json,
    print_next,
    print_table,
)
from conveyor.cli.confirm import confirm_destructive

app = typer.Typer(rich_markup_mode=None, name="agent", help="Agents and their tokens.", no_args_is_help=True)
token_app = typer.Typer(
    rich_markup_mode=None, name="token", help="Agent tokens (cvy_agent_…).", no_args_is_help=True
)
app.add_typer(token_app)

YesFlag = Annotated[bool, typer.Option("--yes", help="Do not ask.")]


@app.command("list")
def list_agents(
    ctx: typer.Context,
    label: Annotated[str | None, typer.Option("--label", help="Only agents carrying this label.")] = None,
    limit: LimitOption = 50,
    all_pages: AllPagesOption = False,
    cursor: CursorOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Known agents: online, draining or offline."""
    client = client_from(ctx, json_output)
    page = client.paged("/agents", follow=all_pages, cursor=cursor, label=label, limit=limit)
    if client.options.json_output:
        print_json(page)
        return
    for row in page["items"]:
        row["labels"] = ",".join(row.get("labels") or [])
    print_table(
        page["items"], ["agent_id", "state", "hostname", "labels", "capacity", "version", "last_seen_at"]
    )
    print_next(client, page)


@app.command("show")
def show(
    ctx: typer.Context, agent_id: Annotated[str, typer.Argument(metavar="ID")], json_output: JsonFlag = False
) -> None:
    """One agent."""
    client = client_from(ctx, json_output)
    body = client.get(f"/agents/{agent_id}")
    if client.options.json_output:
        print_json(body)
        return
    print_fields(body)


@app.command("disconnect")
def disconnect(
    ctx: typer.Context, agent_id: Annotated[str, typer.Argument(metavar="ID")], yes: YesFlag = False
) -> None:
    """Close an agent's connection (it reconnects after its backoff)."""
    confirm_destructive(f"disconnect agent {agent_id}?", yes)
    client_from(ctx).request("POST", f"/agents/{agent_id}/disconnect")
    typer.echo(f"disconnecting {agent_id}")


def _split(values: list[str]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


@token_app.command("create")
def create_token(
    ctx: typer.Context,
    labels: Annotated[str, typer.Option("--labels", help="Labels agents may register, comma-separated.")],
    label: Annotated[str | None, typer.Option("--label", help="A name for the token.")] = None,
    mandatory: Annotated[
        list[str] | None,
        typer.Option("--mandatory-label", help="A label every job for these agents must name (repeatable)."),
    ] = None,
    expires_in_days: Annotated[int | None, typer.Option("--expires-in-days")] = None,
    json_output: JsonFlag = False,
) -> None:
    """Mint an agent token (shown once)."""
    client = client_from(ctx, json_output)
    body: dict[str, object] = {"labels": _split([labels]), "mandatory_labels": _split(mandatory or [])}
    if label is not None:
        body["label"] = label
    if expires_in_days is not None:
        body["expires_in_days"] = expires_in_days
    created = client.request("POST", "/agent-tokens", json_body=body)
    if client.options.json_output:
        print_json(created)
        return
    shown = {k: created[k] for k in ("id", "label", "labels", "mandatory_labels", "expires_at")}
    print_fields(shown)
    typer.echo(f"token  {created['token']}")
    typer.echo("Store it now: it is not shown again.", err=True)


@token_app.command("list")
def list_tokens(
    ctx: typer.Context,
    limit: LimitOption = 50,
    all_pages: AllPagesOption = False,
    cursor: CursorOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Agent tokens' metadata (never the token itself)."""
    client = client_from(ctx, json_output)
    page = client.paged("/agent-tokens", follow=all_pages, cursor=cursor, limit=limit)
    if client.options.json_output:
        print_json(page)
        return
    for row in page["items"]:
        row["labels"] = ",".join(row.get("labels") or [])
    print_table(
        page["items"],
        ["id", "prefix", "kind", "label", "labels", "agent_id", "expires_at", "revoked_at", "last_used_at"],
    )
    print_next(client, page)


@token_app.command("revoke")
def revoke_token(
    ctx: typer.Context, token_id: Annotated[str, typer.Argument(metavar="ID")], yes: YesFlag = False
) -> None:
    """Revoke an agent token; agents connected with it are closed and do not retry."""
    confirm_destructive(f"revoke agent token {token_id}?", yes)
    client_from(ctx).request("DELETE", f"/agent-tokens/{token_id}")
    typer.echo(f"revoked {token_id}")
