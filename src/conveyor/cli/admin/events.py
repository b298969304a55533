"""`conveyor admin event list|show|emit` (docs/design/events.md §7)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from conveyor.cli.admin.client import (
    EXIT_USAGE,
    AdminClient,
    CursorOption,
    JsonFlag,
    LimitOption,
    client_from,
    fail,
    print_fields,
    print_json,
    print_next,
    print_table,
)

app = typer.Typer(
    rich_markup_mode=None,
    name="event",
    help="Internal events: what happened and what it ran.",
    no_args_is_help=True,
)

_RELATIVE = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_time(value: str | None, *, now: datetime | None = None) -> str | None:
    """ISO 8601 as given, or `30m`/`2h`/`7d` ago as ISO 8601 UTC (pure)."""
    if value is None:
        return None
    found = _RELATIVE.match(value.strip())
    if found:
        moment = (now or datetime.now(UTC)) - timedelta(**{_UNITS[found.group(2)]: int(found.group(1))})
        return moment.isoformat()
    try:
        datetime.fromisoformat(value)
    except ValueError:
        fail(f"{value!r} is neither ISO 8601 nor a duration like 30m, 2h or 7d", EXIT_USAGE)
    return value


def show_event(client: AdminClient, path: str, event_id: str) -> None:
    """Print the event at `path` (an event or a dead letter) with its redacted payload when the token
    may read it: the API body as is with `--json`, else fields, runs and payload."""
    body = client.get(path)
    payload = client.try_get(f"/events/{event_id}/payload")
    if payload is not None:
        body["payload"] = payload["payload"]
    if client.options.json_output:
        print_json(body)
        return
    print_fields(body["event"])
    runs = body.get("runs", [])
    typer.echo(f"runs: {len(runs)}")
    for run in runs:
        typer.echo(
            f"  {run['run_id']}  {run['workflow_name']}  {run['repo']}  {run['status']}  {run['created_at']}"
        )
    if "payload" in body:
        typer.echo("payload: " + json.dumps(body["payload"], indent=2, sort_keys=True))


@app.command("list")
def list_events(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Option("--name")] = None,
    outcome: Annotated[str | None, typer.Option("--outcome")] = None,
    state: Annotated[str | None, typer.Option("--state")] = None,
    since: Annotated[str | None, typer.Option("--since", help="ISO 8601 or 30m/2h/7d.")] = None,
    before: Annotated[str | None, typer.Option("--before", help="ISO 8601 or 30m/2h/7d.")] = None,
    limit: LimitOption = 50,
    cursor: CursorOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Events, newest first."""
    client = client_from(ctx, json_output)
    page = client.get(
        "/events",
        name=name,
        outcome=outcome,
        state=state,
        since=parse_time(since),
        before=parse_time(before),
        limit=limit,
        cursor=cursor,
    )
    if client.options.json_output:
        print_json(page)
        return
    for row in page["items"]:
        row["source"] = row.get("source_repo") or row.get("source_routing_key") or ""
    print_table(
        page["items"],
        ["id", "created_at", "name", "state", "match_outcome", "matched_count", "attempts", "source"],
    )
    print_next(client, page)


@app.command("show")
def show(
    ctx: typer.Context, event_id: Annotated[str, typer.Argument(metavar="ID")], json_output: JsonFlag = False
) -> None:
    """An event: fields, the runs it dispatched, and its redacted payload when allowed."""
    show_event(client_from(ctx, json_output), f"/events/{event_id}", event_id)


@app.command("emit")
def emit(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME")],
    payload: Annotated[str | None, typer.Option("--payload", help="A JSON object.")] = None,
    payload_file: Annotated[Path | None, typer.Option("--payload-file")] = None,
    routing_key: Annotated[str | None, typer.Option("--routing-key")] = None,
    source_repo: Annotated[str | None, typer.Option("--source-repo")] = None,
    target_repos: Annotated[list[str] | None, typer.Option("--target-repo", help="Repeatable.")] = None,
    idempotency_key: Annotated[str | None, typer.Option("--idempotency-key")] = None,
    json_output: JsonFlag = False,
) -> None:
    """Emit an operator event; prints its id."""
    if payload is not None and payload_file is not None:
        fail("give --payload or --payload-file, not both", EXIT_USAGE)
    raw = payload
    if payload_file is not None:
        try:
            raw = payload_file.read_text(encoding="utf-8")
        except OSError as exc:
            fail(f"cannot read {payload_file}: {exc}", EXIT_USAGE)
    try:
        document = json.loads(raw) if raw is not None else {}
    except ValueError as exc:
        fail(f"--payload is not JSON: {exc}", EXIT_USAGE)
    if not isinstance(document, dict):
        fail("--payload must be a JSON object", EXIT_USAGE)
    client = client_from(ctx, json_output)
    body: dict[str, Any] = {"name": name, "payload": document}
    for key, value in (("routing_key", routing_key), ("source_repo", source_repo)):
        if value is not None:
            body[key] = value
    if target_repos:
        body["target_repos"] = target_repos
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    answer = client.request("POST", "/events", json_body=body, headers=headers)
    if client.options.json_output:
        print_json(answer)
    else:
        typer.echo(answer["event_id"])
