"""`conveyor admin cluster status|health`: instances, roles, the leader, heartbeat ages, settings versions;
the answering node's `/cluster/health`."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from conveyor.cli.admin.client import EXIT_API, client_from, print_fields, print_json, print_table

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


@app.command("health")
def health(
    ctx: typer.Context,
    json_output: Annotated[bool, typer.Option("--json", help="Print the answer as is.")] = False,
) -> None:
    """The answering node's `/cluster/health`: healthy, degraded or down, and each peer it knows (with a
    token that may read peers). Exits 0 when healthy, 1 when degraded or down."""
    client = client_from(ctx, json_output)
    body = client.request("GET", "/cluster/health", prefix="", answers=frozenset({503}))
    status = body.get("status", "unknown")
    if client.options.json_output:
        print_json(body)
    else:
        lease: dict[str, Any] = body.get("lease") or {}
        print_fields(
            {
                "status": status,
                "answered_by": body.get("instance_id"),
                "role": body.get("role"),
                "leader": lease.get("holder") if "lease" in body else None,
            }
        )
        peers = [
            {
                **peer,
                "connected": "yes" if peer.get("connected") else "no",
                "draining": "yes" if peer.get("draining") else "",
                "heartbeat_age": ""
                if peer.get("last_heartbeat_age_ms") is None
                else f"{peer['last_heartbeat_age_ms']} ms",
            }
            for peer in body.get("peers") or []
        ]
        if peers:
            print_table(
                peers, ["instance_id", "role", "connected", "draining", "heartbeat_age"], title="peers"
            )
    if status != "healthy":
        raise typer.Exit(EXIT_API)
