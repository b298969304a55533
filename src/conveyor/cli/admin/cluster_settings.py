"""`conveyor admin cluster-settings show [--propagation]|set KEY=VALUE…|unset KEY…`
(docs/design/cluster.md §5)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from conveyor.cli.admin.client import JsonFlag, client_from, print_json
from conveyor.cli.admin.settings_args import parse_assignments, parse_keys

app = typer.Typer(
    rich_markup_mode=None,
    name="cluster-settings",
    help="Fleet-wide knobs (cluster_settings).",
    no_args_is_help=True,
)

STATUS_STYLES = {"in-sync": "green", "behind": "bold yellow", "ahead": "bold red"}


def _shown(value: Any) -> str:
    return "-" if value is None else str(value)


def print_settings(body: dict[str, Any]) -> None:
    """Each knob as stored / effective / default, and the version."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"version {body['version']}  (updated {_shown(body.get('updated_at'))})")
    table = Table()
    for column in ("knob", "stored", "effective", "default"):
        table.add_column(column)
    for name, effective in body["effective"].items():
        table.add_row(
            name, _shown(body["settings"].get(name)), _shown(effective), _shown(body["defaults"].get(name))
        )
    console.print(table)


def print_propagation(report: dict[str, Any]) -> None:
    """The Propagation table, highlighting `behind` and `ahead`."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"Propagation (current version {report['current_version']})")
    for column in ("instance_id", "role", "self", "connected", "applied_version", "status", "heartbeat age"):
        table.add_column(column)
    for entry in report["orchestrators"]:
        status = entry["status"]
        age = entry["last_heartbeat_age_ms"]
        table.add_row(
            entry["instance_id"],
            entry["role"],
            "yes" if entry["self"] else "",
            "yes" if entry["connected"] else "no",
            str(entry["applied_version"]),
            f"[{STATUS_STYLES.get(status, '')}]{status}[/]",
            "-" if age is None else f"{age} ms",
        )
    console.print(table)
    if any(e["status"] == "ahead" for e in report["orchestrators"]):
        console.print(
            "[bold red]ahead[/] means a node applied a higher version than the row holds now: the row's "
            "version went backwards (e.g. a database restore); nodes re-pull after a few heartbeats."
        )


@app.command("show")
def show(
    ctx: typer.Context,
    propagation: Annotated[
        bool, typer.Option("--propagation", help="Add how far the version has spread.")
    ] = False,
    json_output: JsonFlag = False,
) -> None:
    """Every knob: stored, effective and default values."""
    client = client_from(ctx, json_output)
    body = client.get("/cluster-settings")
    report = client.get("/cluster-settings/propagation") if propagation else None
    if client.options.json_output:
        print_json({**body, "propagation": report} if report is not None else body)
        return
    print_settings(body)
    if report is not None:
        print_propagation(report)


def _patch(ctx: typer.Context, body: dict[str, object], json_output: bool) -> None:
    client = client_from(ctx, json_output)
    answer = client.request("PATCH", "/cluster-settings", json_body=body)
    if client.options.json_output:
        print_json(answer)
        return
    changed = ", ".join(answer["changed"]) or "nothing"
    typer.echo(f"version {answer['version']}; changed: {changed}")


@app.command("set")
def set_values(
    ctx: typer.Context,
    assignments: Annotated[list[str], typer.Argument(metavar="KEY=VALUE…")],
    json_output: JsonFlag = False,
) -> None:
    """Store knob values (e.g. `reroute_flap_grace_ms=60000`)."""
    _patch(ctx, parse_assignments(assignments), json_output)


@app.command("unset")
def unset_values(
    ctx: typer.Context,
    keys: Annotated[list[str], typer.Argument(metavar="KEY…")],
    json_output: JsonFlag = False,
) -> None:
    """Clear stored values: the env/YAML default applies again."""
    _patch(ctx, parse_keys(keys), json_output)
