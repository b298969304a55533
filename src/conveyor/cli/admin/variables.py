"""`conveyor admin variable list|set|rm`: org variables (not secret; values are shown)."""

from __future__ import annotations

from typing import Annotated

import typer

from conveyor.cli.admin.client import JsonFlag, client_from, print_json, print_table
from conveyor.cli.confirm import confirm_destructive

app = typer.Typer(
    rich_markup_mode=None, name="variable", help="Org variables given to every job.", no_args_is_help=True
)


@app.command("list")
def list_variables(ctx: typer.Context, json_output: JsonFlag = False) -> None:
    """Every org variable."""
    client = client_from(ctx, json_output)
    page = client.get("/variables")
    if client.options.json_output:
        print_json(page)
        return
    print_table(page["items"], ["name", "value", "updated_at"])


@app.command("set")
def set_variable(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument()],
    value: Annotated[str, typer.Argument()],
    json_output: JsonFlag = False,
) -> None:
    """Create or replace an org variable."""
    client = client_from(ctx, json_output)
    variable = client.request("PUT", f"/variables/{name}", json_body={"value": value})
    if client.options.json_output:
        print_json(variable)
        return
    typer.echo(f"set {variable['name']}")


@app.command("rm")
def remove(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument()],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
) -> None:
    """Delete an org variable."""
    confirm_destructive(f"delete variable {name}?", yes)
    client_from(ctx).request("DELETE", f"/variables/{name}")
    typer.echo(f"deleted variable {name}")
