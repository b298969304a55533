"""`conveyor admin …`: operations against the admin API (admin.md §7)."""

from __future__ import annotations

from typing import Annotated

import typer

from conveyor.cli.admin import (
    access_log,
    agents,
    cluster,
    cluster_settings,
    db,
    deliveries,
    dlq,
    events,
    org_settings,
    queue,
    registrations,
    runs,
    scaler,
    sources,
    tokens,
)
from conveyor.cli.admin import environments as environment_cli
from conveyor.cli.admin import secrets as secret_cli
from conveyor.cli.admin import variables as variable_cli
from conveyor.cli.admin.client import DEFAULT_URL, AdminOptions

app = typer.Typer(
    rich_markup_mode=None,
    name="admin",
    help="Operate a running Conveyor through its admin API.",
    no_args_is_help=True,
)


@app.callback()
def admin_options(
    ctx: typer.Context,
    url: Annotated[str, typer.Option("--url", envvar="CONVEYOR_URL", help="Orchestrator URL.")] = DEFAULT_URL,
    token: Annotated[
        str | None, typer.Option("--token", envvar="CONVEYOR_TOKEN", help="Admin token (cvy_admin_…).")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the API body as is.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for an answer.")] = 30.0,
) -> None:
    """Global options of every admin verb."""
    ctx.find_root().obj = AdminOptions(url=url, token=token, json_output=json_output, timeout=timeout)


app.add_typer(tokens.app)
app.add_typer(db.app)
app.add_typer(access_log.app)
app.add_typer(cluster.app)
app.add_typer(cluster_settings.app)
app.add_typer(org_settings.app)
app.add_typer(secret_cli.app)
app.add_typer(environment_cli.app)
app.add_typer(variable_cli.app)
app.add_typer(sources.app)
app.add_typer(deliveries.app)
app.add_typer(runs.app)
app.add_typer(agents.app)
app.add_typer(queue.app)
app.add_typer(events.app)
app.add_typer(dlq.app)
app.add_typer(registrations.app)
app.add_typer(registrations.trust_app)
app.add_typer(scaler.app)
