"""`conveyor admin peer list|join-token|revoke` (docs/design/cluster.md §7.3)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from conveyor.cli.admin.client import (
    EXIT_API,
    EXIT_USAGE,
    JsonFlag,
    client_from,
    fail,
    print_fields,
    print_json,
    print_table,
)

app = typer.Typer(
    rich_markup_mode=None,
    name="peer",
    help="Cluster peers: join tokens, membership, revocation.",
    no_args_is_help=True,
)


@app.command("list")
def list_peers(ctx: typer.Context, json_output: JsonFlag = False) -> None:
    """Every known peer: role, connection, heartbeat, settings version and its credential's dates."""
    client = client_from(ctx, json_output)
    page = client.get("/peers")
    if client.options.json_output:
        print_json(page)
        return
    rows: list[dict[str, Any]] = [
        {
            **item,
            "connected": "yes" if item["connected"] else ("left" if item.get("left") else "no"),
            "draining": "yes" if item["draining"] else "",
        }
        for item in page["items"]
    ]
    print_table(
        rows,
        [
            "instance_id",
            "role",
            "connected",
            "draining",
            "last_heartbeat_at",
            "applied_settings_version",
            "credential_created_at",
            "credential_expires_at",
            "credential_revoked_at",
        ],
    )


@app.command("join-token")
def join_token(
    ctx: typer.Context,
    role: Annotated[str, typer.Option("--role", help="coordinator or worker: the role its credential gets.")],
    expires_in_ms: Annotated[
        int | None,
        typer.Option("--expires-in-ms", help="Lifetime, 60000 (1 min) to 604800000 (7 d); 1 h by default."),
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """A one-time `cvy_join_` token for a new peer (shown once)."""
    client = client_from(ctx, json_output)
    body: dict[str, Any] = {"role": role}
    if expires_in_ms is not None:
        body["expires_in_ms"] = expires_in_ms
    created = client.request("POST", "/peers/join-tokens", json_body=body)
    if client.options.json_output:
        print_json(created)
        return
    print_fields({"id": created["id"], "expires_at": created["expires_at"]})
    typer.echo(f"token  {created['token']}")
    typer.echo(
        "Store it now: it is not shown again. Start the peer with CONVEYOR_CLUSTER_JOIN_TOKEN=<token>.",
        err=True,
    )


@app.command("forget")
def forget(
    ctx: typer.Context,
    instance_id: Annotated[str, typer.Argument(metavar="ID")],
    acknowledge_backstop: Annotated[
        bool,
        typer.Option(
            "--acknowledge-backstop",
            help="Go on even if a coordinator's scaler backstop may then tear down the peer's instances.",
        ),
    ] = False,
    timeout_ms: Annotated[
        int | None,
        typer.Option("--timeout-ms", help="How long to wait for each sibling coordinator (100–60000)."),
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Forget a departed peer on every connected coordinator; exits 0 only if it is gone everywhere."""
    client = client_from(ctx, json_output)
    body: dict[str, Any] = {"instance_id": instance_id, "acknowledge_backstop": acknowledge_backstop}
    if timeout_ms is not None:
        body["timeout_ms"] = timeout_ms
    result = client.request("POST", "/peers/forget", json_body=body, answers=frozenset({409}))
    if result.get("acknowledgement_required"):
        if not sys.stdin.isatty():
            _show_forget(result, json_output)
            fail(
                f"{result['detail']} (acknowledgement_required); pass --acknowledge-backstop to go on",
                EXIT_USAGE,
            )
        _show_forget(result, False)
        if not typer.confirm("forget it anyway?", default=False):
            raise typer.Exit(1)
        body["acknowledge_backstop"] = True
        result = client.request("POST", "/peers/forget", json_body=body)
    _show_forget(result, json_output)
    from conveyor.cluster.forget import SETTLED  # here: the server's modules are not every command's cost

    unsettled = [r for r in result["results"] if r["outcome"] not in SETTLED]
    if unsettled:
        fail(
            "not forgotten everywhere: " + ", ".join(f"{r['coordinator']} {r['outcome']}" for r in unsettled),
            EXIT_API,
        )


def _show_forget(result: dict[str, Any], json_output: bool) -> None:
    if json_output:
        print_json(result)
        return
    print_table(result["results"], ["coordinator", "outcome", "detail"])


@app.command("revoke")
def revoke(
    ctx: typer.Context,
    instance_id: Annotated[str, typer.Argument(metavar="ID")],
    json_output: JsonFlag = False,
) -> None:
    """Revoke a peer's credential and close its sessions on every connected coordinator."""
    client = client_from(ctx, json_output)
    result = client.request("POST", f"/peers/{instance_id}/revoke")
    if client.options.json_output:
        print_json(result)
        return
    print_fields(result)
