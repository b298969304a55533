"""`conveyor admin access-log list|show`."""

from __future__ import annotations

from typing import Annotated

import typer

from conveyor.cli.admin.client import (
    AllPagesOption,
    CursorOption,
    LimitOption,
    client_from,
    print_fields,
    print_json,
    print_next,
    print_table,
)

app = typer.Typer(
    rich_markup_mode=None, name="access-log", help="Who did what through the admin API.", no_args_is_help=True
)


@app.command("list")
def list_rows(
    ctx: typer.Context,
    actor: Annotated[str | None, typer.Option("--actor", help="Token id.")] = None,
    action: Annotated[str | None, typer.Option("--action")] = None,
    outcome: Annotated[str | None, typer.Option("--outcome", help="allowed, denied or error.")] = None,
    target: Annotated[str | None, typer.Option("--target", help="Target id.")] = None,
    source: Annotated[str | None, typer.Option("--source")] = None,
    since: Annotated[str | None, typer.Option("--since")] = None,
    before: Annotated[str | None, typer.Option("--before")] = None,
    limit: LimitOption = 50,
    all_pages: AllPagesOption = False,
    cursor: CursorOption = None,
    json_output: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Newest first."""
    client = client_from(ctx, json_output)
    page = client.paged(
        "/access-log",
        follow=all_pages,
        cursor=cursor,
        actor_id=actor,
        action=action,
        outcome=outcome,
        target_id=target,
        source=source,
        since=since,
        before=before,
        limit=limit,
    )
    if client.options.json_output:
        print_json(page)
        return
    print_table(
        page["items"],
        ["at", "actor_role", "actor_label", "source", "action", "outcome", "status_code", "target_id"],
    )
    print_next(client, page)


@app.command("show")
def show(
    ctx: typer.Context,
    row_id: Annotated[str, typer.Argument(metavar="ID")],
    json_output: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """One row."""
    client = client_from(ctx, json_output)
    row = client.get(f"/access-log/{row_id}")
    if client.options.json_output:
        print_json(row)
    else:
        print_fields(row)
