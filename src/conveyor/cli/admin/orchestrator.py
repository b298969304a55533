"""`conveyor admin orchestrator status|drain|resume [--target ID]` (docs/design/cluster.md §8,
docs/design/admin.md §7)."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from conveyor.cli.admin.client import (
    EXIT_API,
    AdminClient,
    JsonFlag,
    client_from,
    fail,
    print_fields,
    print_json,
)

app = typer.Typer(
    rich_markup_mode=None,
    name="orchestrator",
    help="Drain or resume a coordinator, or a worker through --target.",
    no_args_is_help=True,
)

TargetOption = Annotated[
    str | None,
    typer.Option(
        "--target", metavar="ID", help="Another node (a peer of this coordinator); this one by default."
    ),
]
WAIT_POLL_S = 1.0


def _status(client: AdminClient, target: str | None) -> dict[str, Any]:
    body: dict[str, Any] = client.get("/orchestrator/drain", target=target)
    return body


def _show(client: AdminClient, body: dict[str, Any]) -> None:
    if client.options.json_output:
        print_json(body)
        return
    print_fields(
        {
            "instance_id": body["instance_id"],
            "draining": "yes" if body["draining"] else "no",
            "jobs_running": body["jobs_running"],
        }
    )


def _act(ctx: typer.Context, action: str, target: str | None, json_output: bool) -> tuple[AdminClient, Any]:
    client = client_from(ctx, json_output)
    body: dict[str, Any] = {"action": action}
    if target is not None:
        body["target"] = target
    return client, client.request("POST", "/orchestrator/drain", json_body=body)


@app.command("status")
def status(ctx: typer.Context, target: TargetOption = None, json_output: JsonFlag = False) -> None:
    """Whether the node drains, and how many jobs it still runs."""
    client = client_from(ctx, json_output)
    _show(client, _status(client, target))


@app.command("drain")
def drain(
    ctx: typer.Context,
    target: TargetOption = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until no job runs on the node.")] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds --wait waits before giving up (exit 1).")
    ] = 300.0,
    json_output: JsonFlag = False,
) -> None:
    """Stop the node taking new work; running jobs finish."""
    client, answer = _act(ctx, "drain", target, json_output)
    if wait:
        deadline = time.monotonic() + timeout
        # Polled: the route answers the state now; each look is one GET.
        while answer["jobs_running"] > 0:
            if time.monotonic() >= deadline:
                fail(
                    f"{answer['jobs_running']} jobs still run on {answer['instance_id']} after {timeout:g} s",
                    EXIT_API,
                )
            time.sleep(WAIT_POLL_S)
            answer = _status(client, target)
    _show(client, answer)


@app.command("resume")
def resume(ctx: typer.Context, target: TargetOption = None, json_output: JsonFlag = False) -> None:
    """Take new work again."""
    client, answer = _act(ctx, "resume", target, json_output)
    _show(client, answer)
