"""`conveyor admin environment list|show|set|rm|protect|unprotect` (docs/design/admin.md §6.1,
docs/design/approvals.md §1)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from conveyor.cli.admin.client import (
    EXIT_USAGE,
    AllPagesOption,
    CursorOption,
    JsonFlag,
    client_from,
    fail,
    print_fields,
    print_json,
    print_next,
    print_table,
)
from conveyor.cli.confirm import confirm_destructive

app = typer.Typer(
    rich_markup_mode=None,
    name="environment",
    help="Environments: variables, allowed branches and protection rules.",
    no_args_is_help=True,
)


def parse_assignments(pairs: list[str]) -> dict[str, str]:
    """`K=V` arguments as a mapping (the value may itself contain `=`)."""
    result: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"{pair!r} is not KEY=VALUE", EXIT_USAGE)
        result[key] = value
    return result


def describe_protection(protection: dict[str, Any] | None) -> str:
    """One line for a protection rule (pure)."""
    if not protection:
        return "(none)"
    parts = [f"approvers: {', '.join(protection.get('approvers') or [])}"]
    if protection.get("refs"):
        parts.append(f"refs: {', '.join(protection['refs'])}")
    if protection.get("wait_timer_ms"):
        parts.append(f"wait timer: {int(protection['wait_timer_ms']) // 1000}s")
    if protection.get("prevent_self_approval"):
        parts.append("the triggering token may not approve")
    return "; ".join(parts)


def wait_timer_ms(text: str | None) -> int:
    """`--wait-timer` as milliseconds: an SDK duration (`10m`, `90s`), `0` for none."""
    if text is None or text.strip() == "0":
        return 0
    from conveyor.sdk.durations import duration_ms
    from conveyor.sdk.errors import AuthoringError

    try:
        return duration_ms(text.strip(), what="--wait-timer")
    except AuthoringError as exc:
        fail(str(exc), EXIT_USAGE)


def _show(environment: dict[str, Any]) -> None:
    print_fields(
        {
            "name": environment["name"],
            "allowed_branches": environment["allowed_branches"] or "(any)",
            "protection": describe_protection(environment.get("protection")),
            "created_at": environment["created_at"],
            "updated_at": environment["updated_at"],
        }
    )
    rows = [{"variable": k, "value": v} for k, v in sorted(environment["variables"].items())]
    if rows:
        print_table(rows, ["variable", "value"])


@app.command("list")
def list_environments(
    ctx: typer.Context,
    all_pages: AllPagesOption = False,
    cursor: CursorOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Every environment."""
    client = client_from(ctx, json_output)
    page = client.paged("/environments", follow=all_pages, cursor=cursor)
    if client.options.json_output:
        print_json(page)
        return
    rows = [
        {
            "name": e["name"],
            "variables": len(e["variables"]),
            "allowed_branches": ", ".join(e["allowed_branches"]) or "(any)",
            "updated_at": e["updated_at"],
        }
        for e in page["items"]
    ]
    print_table(rows, ["name", "variables", "allowed_branches", "updated_at"])
    print_next(client, page)


@app.command("show")
def show(ctx: typer.Context, name: Annotated[str, typer.Argument()], json_output: JsonFlag = False) -> None:
    """One environment with its variables."""
    client = client_from(ctx, json_output)
    environment = client.get(f"/environments/{name}")
    if client.options.json_output:
        print_json(environment)
        return
    _show(environment)


@app.command("set")
def set_environment(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument()],
    var: Annotated[
        list[str] | None, typer.Option("--var", help="KEY=VALUE; repeat. Replaces the variables.")
    ] = None,
    allow_branch: Annotated[
        list[str] | None, typer.Option("--allow-branch", help="Branch glob; repeat. Replaces the list.")
    ] = None,
    clear_vars: Annotated[bool, typer.Option("--clear-vars", help="Remove every variable.")] = False,
    any_branch: Annotated[bool, typer.Option("--any-branch", help="Allow every branch.")] = False,
    json_output: JsonFlag = False,
) -> None:
    """Create or update an environment; options not given keep their current value."""
    if var and clear_vars:
        fail("give --var or --clear-vars, not both", EXIT_USAGE)
    if allow_branch and any_branch:
        fail("give --allow-branch or --any-branch, not both", EXIT_USAGE)
    body: dict[str, Any] = {}
    if var or clear_vars:
        body["variables"] = parse_assignments(var or [])
    if allow_branch or any_branch:
        body["allowed_branches"] = list(allow_branch or [])
    client = client_from(ctx, json_output)
    environment = client.request("PUT", f"/environments/{name}", json_body=body)
    if client.options.json_output:
        print_json(environment)
        return
    _show(environment)


@app.command("rm")
def remove(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument()],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
) -> None:
    """Delete an environment and its env/<name> secrets."""
    confirm_destructive(f"delete environment {name} and its secrets?", yes)
    client_from(ctx).request("DELETE", f"/environments/{name}")
    typer.echo(f"deleted environment {name}")


@app.command("protect")
def protect(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument()],
    approver: Annotated[
        list[str] | None,
        typer.Option("--approver", help="A role (owner, admin, operator) or a token's label or id; repeat."),
    ] = None,
    refs: Annotated[
        list[str] | None, typer.Option("--refs", help="Ref glob that may deploy here; repeat. Default: any.")
    ] = None,
    wait_timer: Annotated[
        str | None, typer.Option("--wait-timer", help="Delay after approval, e.g. 10m.")
    ] = None,
    prevent_self_approval: Annotated[
        bool,
        typer.Option("--prevent-self-approval", help="The token that triggered a run may not approve it."),
    ] = False,
    json_output: JsonFlag = False,
) -> None:
    """Protect an environment: its jobs wait for one of the approvers (replaces the rule)."""
    if not approver:
        fail("give at least one --approver", EXIT_USAGE)
    body = {
        "approvers": list(approver or []),
        "refs": list(refs or []),
        "wait_timer_ms": wait_timer_ms(wait_timer),
        "prevent_self_approval": prevent_self_approval,
    }
    client = client_from(ctx, json_output)
    environment = client.request("PUT", f"/environments/{name}/protection", json_body=body)
    if client.options.json_output:
        print_json(environment)
        return
    _show(environment)


@app.command("unprotect")
def unprotect(ctx: typer.Context, name: Annotated[str, typer.Argument()]) -> None:
    """Remove an environment's protection rule (jobs already waiting still need a decision)."""
    client_from(ctx).request("DELETE", f"/environments/{name}/protection")
    typer.echo(f"environment {name} is no longer protected")
