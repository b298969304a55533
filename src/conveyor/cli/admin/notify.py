"""`conveyor admin notify …`: notification rules (docs/design/events.md §10)."""

from __future__ import annotations

from typing import Annotated

import typer

from conveyor.cli.admin.client import EXIT_USAGE, JsonFlag, client_from, fail, print_json, print_table

app = typer.Typer(
    rich_markup_mode=None,
    name="notify",
    help=(
        "Notification rules: email or a webhook when runs fail, are fixed or succeed, "
        "or a job waits for approval."
    ),
    no_args_is_help=True,
)


@app.command("add")
def add(
    ctx: typer.Context,
    on: Annotated[
        str, typer.Option("--on", help="Comma-separated: failed, fixed, succeeded, approval_requested.")
    ],
    source: Annotated[
        str | None, typer.Option("--source", help="Source id or name (default: every source).")
    ] = None,
    workflow: Annotated[str | None, typer.Option("--workflow", help="Only this workflow.")] = None,
    ref: Annotated[str | None, typer.Option("--ref", help="Branch glob: main, release/*.")] = None,
    email: Annotated[str | None, typer.Option("--email", help="Send email to this address.")] = None,
    webhook: Annotated[
        str | None,
        typer.Option(
            "--webhook", help="POST JSON to this URL, or to secret:NAME (an org secret holding it)."
        ),
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Add a rule; prints its id."""
    if (email is None) == (webhook is None):
        fail("give exactly one of --email and --webhook", EXIT_USAGE)
    events = [item.strip() for item in on.split(",") if item.strip()]
    body = {
        "on": events,
        "source": source,
        "workflow": workflow,
        "ref": ref,
        "email": email,
        "webhook": webhook,
    }
    client = client_from(ctx, json_output)
    answer = client.request("POST", "/notification-rules", json_body={k: v for k, v in body.items() if v})
    if client.options.json_output:
        print_json(answer)
    else:
        typer.echo(answer["id"])


@app.command("list")
def list_rules(ctx: typer.Context, json_output: JsonFlag = False) -> None:
    """Every rule (a webhook shows its host only)."""
    client = client_from(ctx, json_output)
    page = client.get("/notification-rules")
    if client.options.json_output:
        print_json(page)
        return
    rows = [
        {
            **r,
            "on": ",".join(r["on"]),
            "source": r["source"] or "(all)",
            "target": f"{r['target_kind']}:{r['target']}",
        }
        for r in page["items"]
    ]
    print_table(rows, ["id", "source", "on", "workflow", "ref", "target"])


@app.command("remove")
def remove(ctx: typer.Context, rule_id: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Remove a rule."""
    client_from(ctx).request("DELETE", f"/notification-rules/{rule_id}")
    typer.echo(f"removed {rule_id}")
