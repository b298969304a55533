"""`conveyor admin dlq list|show|retry|discard` (docs/design/events.md §7)."""

from __future__ import annotations

from typing import Annotated

import typer

from conveyor.cli.admin.client import (
    EXIT_USAGE,
    CursorOption,
    JsonFlag,
    LimitOption,
    client_from,
    fail,
    print_json,
    print_next,
    print_table,
)
from conveyor.cli.admin.events import show_event

app = typer.Typer(
    rich_markup_mode=None, name="dlq", help="Dead-lettered internal events.", no_args_is_help=True
)


@app.command("list")
def list_dlq(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Option("--name")] = None,
    reason: Annotated[
        str | None, typer.Option("--reason", help="exhausted_retries or non_retryable.")
    ] = None,
    limit: LimitOption = 50,
    cursor: CursorOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Dead letters, newest first."""
    client = client_from(ctx, json_output)
    page = client.get("/event-dlq", name=name, reason=reason, limit=limit, cursor=cursor)
    if client.options.json_output:
        print_json(page)
        return
    print_table(page["items"], ["id", "dlq_at", "name", "dlq_reason", "attempts", "last_error"])
    print_next(client, page)


@app.command("show")
def show(
    ctx: typer.Context, event_id: Annotated[str, typer.Argument(metavar="ID")], json_output: JsonFlag = False
) -> None:
    """A dead letter, with its redacted payload when allowed."""
    show_event(client_from(ctx, json_output), f"/event-dlq/{event_id}", event_id)


@app.command("retry")
def retry(
    ctx: typer.Context, event_id: Annotated[str, typer.Argument(metavar="ID")], json_output: JsonFlag = False
) -> None:
    """Send a dead letter back to pending (attempts reset)."""
    client = client_from(ctx, json_output)
    answer = client.request("POST", f"/event-dlq/{event_id}/retry")
    if client.options.json_output:
        print_json(answer)
    else:
        typer.echo(f"{answer['event_id']} {answer['state']}")


@app.command("discard")
def discard(
    ctx: typer.Context,
    event_id: Annotated[str, typer.Argument(metavar="ID")],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
) -> None:
    """Delete a dead letter for good."""
    if not yes and not typer.confirm(f"delete dead letter {event_id}?"):
        fail("not confirmed", EXIT_USAGE)
    client_from(ctx).request("DELETE", f"/event-dlq/{event_id}")
    typer.echo(f"discarded {event_id}")
