"""`conveyor admin registration …` and `conveyor admin trust …` (docs/design/events.md §5, §7)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from conveyor.cli.admin.client import (
    EXIT_API,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
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
    name="registration",
    help="Workflows registered for events and schedules.",
    no_args_is_help=True,
)
trust_app = typer.Typer(
    rich_markup_mode=None, name="trust", help="Event trust grants between routing keys.", no_args_is_help=True
)


@app.command("list")
def list_registrations(
    ctx: typer.Context,
    routing_key: Annotated[str | None, typer.Option("--routing-key")] = None,
    repo: Annotated[str | None, typer.Option("--repo")] = None,
    trigger_kind: Annotated[str | None, typer.Option("--trigger-kind")] = None,
    workflow: Annotated[str | None, typer.Option("--workflow")] = None,
    limit: LimitOption = 50,
    cursor: CursorOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Registrations, newest first."""
    client = client_from(ctx, json_output)
    page = client.get(
        "/registrations",
        routing_key=routing_key,
        repo=repo,
        trigger_kind=trigger_kind,
        workflow=workflow,
        limit=limit,
        cursor=cursor,
    )
    if client.options.json_output:
        print_json(page)
        return
    for row in page["items"]:
        row["kinds"] = ",".join(row.get("trigger_kinds", []))
    print_table(
        page["items"], ["id", "routing_key", "repo", "workflow_name", "kinds", "disabled", "commit_sha"]
    )
    print_next(client, page)


@app.command("show")
def show(
    ctx: typer.Context,
    registration_id: Annotated[str, typer.Argument(metavar="ID")],
    json_output: JsonFlag = False,
) -> None:
    """A registration, its lock entry and schedules."""
    client = client_from(ctx, json_output)
    body = client.get(f"/registrations/{registration_id}")
    if client.options.json_output:
        print_json(body)
        return
    schedules = body.pop("schedules", [])
    body.pop("lock_entry", None)
    print_fields(body)
    print_table(
        schedules, ["cron", "timezone", "armed_at", "last_slot_at", "next_slot_at"], title="schedules"
    )


@app.command("register-manual")
def register_manual(
    ctx: typer.Context,
    lock_file: Annotated[Path, typer.Option("--lock-file")],
    repo: Annotated[str, typer.Option("--repo")],
    routing_key: Annotated[str, typer.Option("--routing-key")],
    commit_sha: Annotated[str | None, typer.Option("--commit-sha")] = None,
    default_branch: Annotated[str | None, typer.Option("--default-branch")] = None,
    workflows: Annotated[list[str] | None, typer.Option("--workflow", help="Only these workflows.")] = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            help="Write straight into this database instead of calling the API (the orchestrator is down).",
        ),
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Register a lock's workflows without pruning the repository's other registrations."""
    if database_url:
        _register_manual_offline(
            database_url, lock_file, repo, routing_key, commit_sha, default_branch, workflows, json_output
        )
        return
    try:
        lock = json.loads(lock_file.read_text(encoding="utf-8"))
    except OSError as exc:
        fail(f"cannot read {lock_file}: {exc}", EXIT_USAGE)
    except ValueError as exc:
        fail(f"{lock_file} is not JSON: {exc}", EXIT_USAGE)
    body: dict[str, Any] = {"routing_key": routing_key, "repo": repo, "lock": lock}
    if commit_sha:
        body["commit_sha"] = commit_sha
    if default_branch:
        body["default_branch"] = default_branch
    if workflows:
        body["workflows"] = workflows
    client = client_from(ctx, json_output)
    answer = client.request("POST", "/registrations/manual", json_body=body)
    if client.options.json_output:
        print_json(answer)
    else:
        print_fields(answer)


def _register_manual_offline(
    database_url: str,
    lock_file: Path,
    repo: str,
    routing_key: str,
    commit_sha: str | None,
    default_branch: str | None,
    workflows: list[str] | None,
    json_output: bool,
) -> None:
    """`register-manual --database-url`: the same rows through the same function, without the API."""
    import asyncio

    from conveyor.events.offline import InvalidLockFile, OfflineError, register_manual_offline
    from conveyor.events.registrations import UnknownRoutingKey

    try:
        lock_bytes = lock_file.read_bytes()
    except OSError as exc:
        fail(f"cannot read {lock_file}: {exc}", EXIT_USAGE)
    try:
        result = asyncio.run(
            register_manual_offline(
                database_url,
                routing_key=routing_key,
                repo=repo,
                lock_bytes=lock_bytes,
                commit_sha=commit_sha,
                default_branch=default_branch,
                only=workflows or None,
            )
        )
    except InvalidLockFile as exc:
        fail(f"{lock_file} is not a valid lock file: {exc}", EXIT_USAGE)
    except UnknownRoutingKey as exc:
        fail(str(exc), EXIT_NOT_FOUND)
    except OfflineError as exc:
        fail(str(exc), EXIT_API)
    answer = {"created": result.created, "updated": result.updated, "skipped_global": result.skipped_global}
    if json_output:
        print_json(answer)
    else:
        print_fields(answer)


@app.command("refresh")
def refresh(
    ctx: typer.Context,
    routing_key: Annotated[
        str | None, typer.Option("--routing-key", help="One source; default every one.")
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Re-sync registrations from the default branch of each source (like a push there)."""
    client = client_from(ctx, json_output)
    answer = client.request("POST", "/registrations/refresh", json_body={"routing_key": routing_key})
    if client.options.json_output:
        print_json(answer)
        return
    for item in answer["items"]:
        outcome = item.get("commit_sha") or f"{item.get('error')}: {item.get('detail')}"
        typer.echo(f"{item['routing_key']}  {outcome}")


def _set_disabled(ctx: typer.Context, registration_id: str, disabled: bool) -> None:
    answer = client_from(ctx).request(
        "PATCH", f"/registrations/{registration_id}", json_body={"disabled": disabled}
    )
    typer.echo(f"{answer['id']} {'disabled' if answer['disabled'] else 'enabled'}")


@app.command("disable")
def disable(ctx: typer.Context, registration_id: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Stop routing to a registration."""
    _set_disabled(ctx, registration_id, True)


@app.command("enable")
def enable(ctx: typer.Context, registration_id: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Route to it again (schedules re-armed: no immediate fire)."""
    _set_disabled(ctx, registration_id, False)


@app.command("rm")
def remove(
    ctx: typer.Context,
    registration_id: Annotated[str, typer.Argument(metavar="ID")],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
) -> None:
    """Delete a registration (the next push re-creates it if the workflow still exists)."""
    if not yes and not typer.confirm(f"delete registration {registration_id}?"):
        fail("not confirmed", EXIT_USAGE)
    client_from(ctx).request("DELETE", f"/registrations/{registration_id}")
    typer.echo(f"removed {registration_id}")


@trust_app.command("list")
def trust_list(ctx: typer.Context, json_output: JsonFlag = False) -> None:
    """Trust grants."""
    client = client_from(ctx, json_output)
    page = client.get("/event-trust")
    if client.options.json_output:
        print_json(page)
        return
    print_table(
        page["items"],
        ["id", "source_routing_key", "source_repo", "target_routing_key", "target_repo", "event_names"],
    )


@trust_app.command("add")
def trust_add(
    ctx: typer.Context,
    source_routing_key: Annotated[str, typer.Option("--source-routing-key")],
    target_routing_key: Annotated[str, typer.Option("--target-routing-key")],
    events: Annotated[list[str], typer.Option("--event", help="Event-name glob, repeatable.")],
    source_repo: Annotated[str, typer.Option("--source-repo")] = "*",
    target_repo: Annotated[str, typer.Option("--target-repo")] = "*",
    json_output: JsonFlag = False,
) -> None:
    """Let events of one routing key trigger workflows of another (the target consents)."""
    client = client_from(ctx, json_output)
    answer = client.request(
        "POST",
        "/event-trust",
        json_body={
            "source_routing_key": source_routing_key,
            "source_repo": source_repo,
            "target_routing_key": target_routing_key,
            "target_repo": target_repo,
            "event_names": events,
        },
    )
    if client.options.json_output:
        print_json(answer)
    else:
        typer.echo(answer["id"])


@trust_app.command("rm")
def trust_rm(ctx: typer.Context, grant_id: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Remove a grant."""
    client_from(ctx).request("DELETE", f"/event-trust/{grant_id}")
    typer.echo(f"removed {grant_id}")
