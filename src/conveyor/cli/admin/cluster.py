"""`conveyor admin cluster status`: instances, roles, the leader, heartbeat ages, settings versions."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from conveyor.cli.admin.client import client_from, print_fields, print_json, print_table

app = typer.Typer(
    rich_markup_mode=None, name="cluster", help="The cluster's nodes and leadership.", no_args_is_help=True
)


@app.command("status")
def status(
    ctx: typer.Context,
    json_output: Annotated[bool, typer.Option("--json", help="Print the API body as is.")] = False,
) -> None:
    """Every instance row, which one leads, and how fresh each heartbeat is."""
    client = client_from(ctx, json_output)
    body = client.get("/cluster/status")
    if client.options.json_output:
        print_json(body)
        return
    lease: dict[str, Any] = body.get("lease") or {}
    print_fields(
        {
            "answered_by": body["instance_id"],
            "leader": body["leader"] or "none (no live lease)",
            "epoch": lease.get("epoch"),
            "lease_expires_at": lease.get("expires_at"),
        }
    )
    rows = [
        {
            **instance,
            "leader": "*" if instance["leader"] else "",
            "heartbeat_age": f"{instance['last_heartbeat_age_ms']} ms",
            "live": "yes" if instance["live"] else "stale",
        }
        for instance in body["instances"]
    ]
    print_table(
        rows,
        [
            "instance_id",
            "role",
            "leader",
            "live",
            "draining",
            "heartbeat_age",
            "applied_settings_version",
            "software_version",
            "advertise_url",
        ],
    )
