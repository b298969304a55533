"""`conveyor admin token create|list|revoke|bootstrap`."""

from __future__ import annotations

from typing import Annotated

import typer

from conveyor.cli.admin.client import (
    EXIT_API,
    JsonFlag,
    client_from,
    fail,
    print_fields,
    print_json,
    print_table,
)
from conveyor.cli.confirm import confirm_destructive

app = typer.Typer(rich_markup_mode=None, name="token", help="Admin tokens.", no_args_is_help=True)


@app.command("create")
def create(
    ctx: typer.Context,
    role: Annotated[str, typer.Option("--role", help="owner, admin, operator or auditor.")],
    label: Annotated[str | None, typer.Option("--label")] = None,
    routing_key: Annotated[
        str | None, typer.Option("--routing-key", help="Limit the token to one key.")
    ] = None,
    expires_in_days: Annotated[int | None, typer.Option("--expires-in-days")] = None,
    json_output: JsonFlag = False,
) -> None:
    """Mint an admin token (shown once)."""
    client = client_from(ctx, json_output)
    body = {"label": label, "role": role, "routing_key": routing_key, "expires_in_days": expires_in_days}
    created = client.request("POST", "/tokens", json_body={k: v for k, v in body.items() if v is not None})
    if client.options.json_output:
        print_json(created)
        return
    print_fields({k: created[k] for k in ("id", "role", "label", "routing_key", "expires_at")})
    typer.echo(f"token  {created['token']}")
    typer.echo("Store it now: it is not shown again.", err=True)


@app.command("list")
def list_tokens(ctx: typer.Context, json_output: JsonFlag = False) -> None:
    """Every admin token's metadata."""
    client = client_from(ctx, json_output)
    page = client.get("/tokens")
    if client.options.json_output:
        print_json(page)
        return
    print_table(
        page["items"],
        ["id", "prefix", "role", "label", "routing_key", "created_at", "revoked_at", "last_used_at"],
    )


@app.command("revoke")
def revoke(
    ctx: typer.Context,
    token_id: Annotated[str, typer.Argument(metavar="ID")],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
) -> None:
    """Revoke a token at once."""
    confirm_destructive(f"revoke admin token {token_id}?", yes)
    client_from(ctx).request("DELETE", f"/tokens/{token_id}")
    typer.echo(f"revoked {token_id}")


@app.command("bootstrap")
def bootstrap(
    database_url: Annotated[
        str,
        typer.Option("--database-url", envvar="CONVEYOR_DATABASE_URL", help="The orchestrator's database."),
    ],
    label: Annotated[str | None, typer.Option("--label")] = None,
) -> None:
    """Offline: mint an owner token directly in the database (lost token, scripted installs)."""
    from conveyor.admin.offline import OfflineError, bootstrap_owner_offline

    try:
        import asyncio

        token = asyncio.run(bootstrap_owner_offline(database_url, label=label))
    except OfflineError as exc:
        fail(str(exc), EXIT_API)
    typer.echo(token)
