"""`conveyor admin org-settings show ORG|set ORG KEY=VALUE…|unset ORG KEY…` (docs/design/cluster.md §6)."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

import typer

from conveyor.cli.admin.client import JsonFlag, client_from, print_json
from conveyor.cli.admin.settings_args import parse_assignments, parse_keys

app = typer.Typer(
    rich_markup_mode=None, name="org-settings", help="Per-org overrides (org_settings).", no_args_is_help=True
)

OrgArgument = Annotated[str, typer.Argument(metavar="ORG")]


def _path(org: str) -> str:
    return f"/org-settings/{quote(org, safe='')}"


def _shown(value: Any) -> str:
    if isinstance(value, list):  # global_sources (docs/design/global_workflows.md §1)
        return ",".join(value) or "-"
    return "-" if value is None else str(value)


def print_org_settings(body: dict[str, Any]) -> None:
    """Each knob as override / effective, and the version."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"org {body['org_id']}  version {body['version']}")
    table = Table()
    for column in ("knob", "override", "effective"):
        table.add_column(column)
    for name, effective in body["effective"].items():
        shown = _shown(effective) if isinstance(effective, list) else None
        table.add_row(
            name,
            _shown(body["settings"].get(name)),
            shown or ("unlimited" if effective is None else str(effective)),
        )
    console.print(table)


@app.command("show")
def show(ctx: typer.Context, org: OrgArgument, json_output: JsonFlag = False) -> None:
    """An org's overrides and the values that apply to it."""
    client = client_from(ctx, json_output)
    body = client.get(_path(org))
    if client.options.json_output:
        print_json(body)
        return
    print_org_settings(body)


def _patch(ctx: typer.Context, org: str, body: dict[str, object], json_output: bool) -> None:
    client = client_from(ctx, json_output)
    answer = client.request("PATCH", _path(org), json_body=body)
    if client.options.json_output:
        print_json(answer)
        return
    changed = ", ".join(answer["changed"]) or "nothing"
    typer.echo(f"org {answer['org_id']} version {answer['version']}; changed: {changed}")


@app.command("set")
def set_values(
    ctx: typer.Context,
    org: OrgArgument,
    assignments: Annotated[list[str], typer.Argument(metavar="KEY=VALUE…")],
    json_output: JsonFlag = False,
) -> None:
    """Override knobs for one org (e.g. `reroute_spawn_max_attempts=2`), or name its policy sources
    (`global_sources=local:policy,github:acme/platform`)."""
    _patch(ctx, org, parse_assignments(assignments), json_output)


@app.command("unset")
def unset_values(
    ctx: typer.Context,
    org: OrgArgument,
    keys: Annotated[list[str], typer.Argument(metavar="KEY…")],
    json_output: JsonFlag = False,
) -> None:
    """Remove overrides: the cluster value (or default) applies again."""
    _patch(ctx, org, parse_keys(keys), json_output)
