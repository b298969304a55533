"""`conveyor admin delivery list|show|replay`."""

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

app = typer.Typer(
    rich_markup_mode=None,
    name="delivery",
    help="Webhook deliveries and what became of them.",
    no_args_is_help=True,
)


@app.command("list")
def list_deliveries(
    ctx: typer.Context,
    source: Annotated[str | None, typer.Option("--source")] = None,
    since: Annotated[str | None, typer.Option("--since")] = None,
    limit: LimitOption = 50,
    all_pages: AllPagesOption = False,
    cursor: CursorOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Newest first."""
    client = client_from(ctx, json_output)
    page = client.paged(
        "/deliveries", follow=all_pages, cursor=cursor, source=source, since=since, limit=limit
    )
    if client.options.json_output:
        print_json(page)
    else:
        print_table(page["items"], ["id", "received_at", "event", "status", "skipped", "run_count", "error"])
    print_next(client, page)


@app.command("show")
def show(
    ctx: typer.Context,
    delivery: Annotated[str, typer.Argument(metavar="ID")],
    payload: Annotated[bool, typer.Option("--payload", help="Also print the stored body.")] = False,
    json_output: JsonFlag = False,
) -> None:
    """A delivery: status, why, and the runs it created."""
    client = client_from(ctx, json_output)
    body = client.get(f"/deliveries/{delivery}")
    if payload:
        body["payload"] = client.get(f"/deliveries/{delivery}/payload")["payload"]
    if client.options.json_output:
        print_json(body)
    else:
        print_fields(body)


@app.command("replay")
def replay(ctx: typer.Context, delivery: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Process a failed delivery again."""
    body = client_from(ctx).request("POST", f"/deliveries/{delivery}/replay")
    typer.echo(f"{body['status']}: {body['delivery']}")
