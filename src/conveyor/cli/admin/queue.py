"""`conveyor admin queue list|show|clear`: what waits for an agent, and why."""

from __future__ import annotations

from typing import Annotated, Any

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

app = typer.Typer(rich_markup_mode=None, name="queue", help="The dispatch queue.", no_args_is_help=True)


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    row["run"] = f"{row.get('workflow')} #{row.get('run_number')}"
    row["why"] = row.get("note") or (f"claimed by {row['agent_id']}" if row.get("agent_id") else "")
    return row


@app.command("list")
def list_queue(
    ctx: typer.Context,
    state: Annotated[str | None, typer.Option("--state", help="pending, claimed or started.")] = None,
    limit: LimitOption = 50,
    all_pages: AllPagesOption = False,
    cursor: CursorOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Queued and claimed jobs, each with `waiting: …` or `unschedulable: <reason>`."""
    client = client_from(ctx, json_output)
    page = client.paged("/queue", follow=all_pages, cursor=cursor, state=state, limit=limit)
    if client.options.json_output:
        print_json(page)
        return
    rows = [_shown(row) for row in page["items"]]
    print_table(rows, ["job_id", "display_name", "run", "state", "attempts", "agent_id", "why"])
    print_next(client, page)


@app.command("show")
def show(
    ctx: typer.Context, job_id: Annotated[str, typer.Argument(metavar="ID")], json_output: JsonFlag = False
) -> None:
    """One queue row, by job id."""
    client = client_from(ctx, json_output)
    body = client.get(f"/queue/{job_id}")
    if client.options.json_output:
        print_json(body)
        return
    print_fields(body)


@app.command("clear")
def clear(
    ctx: typer.Context,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
    json_output: JsonFlag = False,
) -> None:
    """Cancel every job still waiting in the queue (reason `admin_clear`)."""
    confirm_destructive("cancel every queued job?", yes)
    client = client_from(ctx, json_output)
    body = client.request("POST", "/queue/clear", json_body={"confirm": True})
    if client.options.json_output:
        print_json(body)
        return
    typer.echo(f"cancelled {body['cancelled']} queued job(s) in {len(body['run_ids'])} run(s)")
