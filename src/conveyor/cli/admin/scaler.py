"""`conveyor admin scaler status|reload|orphans list|orphans stop|config get|set|validate`
(docs/design/admin.md §7, docs/design/scaler.md §7 and §11)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from conveyor.cli.admin.client import EXIT_USAGE, JsonFlag, client_from, fail, print_json, print_table

app = typer.Typer(
    rich_markup_mode=None,
    name="scaler",
    help="The auto-scaler of the node that answers.",
    no_args_is_help=True,
)
orphans_app = typer.Typer(
    rich_markup_mode=None,
    name="orphans",
    help="Live VMs and agent processes nothing tracks.",
    no_args_is_help=True,
)
app.add_typer(orphans_app)
config_app = typer.Typer(
    rich_markup_mode=None,
    name="config",
    help="The shared scalers.yaml that coordinators keep in the database (nodes without a local file run it).",
    no_args_is_help=True,
)
app.add_typer(config_app)

TargetOption = Annotated[
    str | None, typer.Option("--target", help="Instance id of the node to ask (default: the one answering).")
]


def status_lines(scaler: dict[str, Any]) -> list[str]:
    """One scaler's status as `key: value` lines (the error is never cut)."""
    backoff = scaler.get("backoff") or {}
    lines = [
        f"{scaler['name']} ({scaler['type']}): {scaler['state']}",
        f"  capacity: {scaler['active']}/{scaler['max_agents']} active, {scaler['spawning']} spawning",
        f"  warm: {scaler['warm_idle']} idle of {scaler['warm_target']}",
        "  label sets: " + "; ".join("[" + ", ".join(ls) + "]" for ls in scaler.get("label_sets", [])),
    ]
    if scaler.get("mandatory_labels"):
        lines.append("  mandatory labels: " + ", ".join(scaler["mandatory_labels"]))
    if scaler.get("runtime"):
        engine = f" at {scaler['engine']}" if scaler.get("engine") else ""
        lines.append(f"  runtime: {scaler['runtime']}{engine}")
    state = backoff.get("state", "ready")
    failures = backoff.get("consecutive_failures", 0)
    if backoff.get("next_attempt_at"):
        lines.append(
            f"  backoff: {state}, {failures} failure(s) in a row, next attempt at {backoff['next_attempt_at']}"
        )
    else:
        lines.append(f"  backoff: {state}, {failures} failure(s) in a row")
    if backoff.get("last_error"):
        lines.append(f"  last error: {backoff['last_error']}")
    return lines


@app.command("status")
def status(ctx: typer.Context, json_output: JsonFlag = False) -> None:
    """Per scaler: capacity, active, warm agents, backoff state and the last error."""
    client = client_from(ctx, json_output)
    body = client.get("/scaler/status")
    if client.options.json_output:
        print_json(body)
        return
    if not body["scalers"]:
        typer.echo(f"node {body['node']}: no scalers configured")
        typer.echo(config_line(body.get("config") or {}))
        return
    typer.echo(f"node {body['node']}")
    typer.echo(config_line(body.get("config") or {}))
    for scaler in body["scalers"]:
        typer.echo("\n".join(status_lines(scaler)))


ReloadTarget = Annotated[
    str | None,
    typer.Option(
        "--target",
        help="Instance id of the node to reload, or `all` (every node the answering coordinator knows); "
        "default: the one answering.",
    ),
]


def reload_lines(body: dict[str, Any]) -> list[str]:
    """One line per node of a `reload --target` answer: its outcome and why."""
    return [f"{r['node']} ({r['role']}): {r['outcome']} ({r['detail']})" for r in body["results"]]


@app.command("reload")
def reload(
    ctx: typer.Context,
    target: ReloadTarget = None,
    timeout_ms: Annotated[
        int | None, typer.Option("--timeout-ms", help="How long each other node has to answer (ms).")
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Re-read scalers.yaml: everything is applied, or nothing (each problem is listed). With --target, on
    that node (or every node: `all`); exits 0 only when every node reloaded."""
    client = client_from(ctx, json_output)
    if target is None:
        body = client.request("POST", "/scaler/reload")
        if client.options.json_output:
            print_json(body)
            return
        typer.echo("scaler configuration reloaded: " + (", ".join(body.get("scalers", [])) or "no scalers"))
        return
    body = client.request("POST", "/scaler/reload", json_body={"target": target, "timeout_ms": timeout_ms})
    if client.options.json_output:
        print_json(body)
    else:
        typer.echo("\n".join(reload_lines(body)))
    if any(result["outcome"] != "reloaded" for result in body["results"]):
        raise typer.Exit(1)


@orphans_app.command("list")
def list_orphans(ctx: typer.Context, target: TargetOption = None, json_output: JsonFlag = False) -> None:
    """Live items on the node: tracked (and by what), untracked, or unknown."""
    client = client_from(ctx, json_output)
    body = client.get("/scaler/orphans", target=target)
    if client.options.json_output:
        print_json(body)
        return
    rows = []
    for item in body["items"]:
        rows.append({**item, "tracked_by": ", ".join(item["tracked_by"]) or "-"})
    print_table(
        rows,
        ["vm_id", "kind", "backend", "pid", "state", "tracked_by", "job_id"],
        title=f"node {body['node']}",
    )
    if not body["complete"]:
        typer.echo(
            "incomplete: coordinators disconnected ("
            + ", ".join(body["disconnected_coordinators"])
            + "); nothing is reported untracked",
            err=True,
        )


@orphans_app.command("stop")
def stop_orphans(
    ctx: typer.Context,
    vm_ids: Annotated[list[str], typer.Argument(metavar="ID...", help="Ids from `orphans list`.")],
    target: TargetOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Stop the named items that are untracked now; tracked ones are refused with their tracker."""
    client = client_from(ctx, json_output)
    body = client.request("POST", "/scaler/orphans/stop", json_body={"vm_ids": vm_ids, "target": target})
    if client.options.json_output:
        print_json(body)
        return
    refused = False
    for result in body["results"]:
        typer.echo(f"{result['vm_id']}: {result['outcome']} ({result['detail']})")
        refused = refused or result["outcome"] not in ("stopped",)
    if refused:
        raise typer.Exit(1)


def config_line(config: dict[str, Any]) -> str:
    """Where the node's running configuration comes from (docs/design/scaler.md §11)."""
    origin = config.get("origin", "none")
    line = f"configuration: {origin}"
    if origin == "shared":
        line += f" (version {config.get('shared_version')})"
    elif origin == "local" and config.get("stored_shared_version"):
        line += f" (a shared configuration, version {config['stored_shared_version']}, is stored; local files win)"
    if config.get("shared_error"):
        line += f"\nshared configuration refused on this node: {config['shared_error']}"
    return line


def _read_content(path: str) -> str:
    """A file's text, or stdin's for `-`."""
    import sys

    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}", EXIT_USAGE)


def _refused(body: dict[str, Any]) -> None:
    """Print a refused configuration's problems, one a line, and exit 2."""
    import sys

    sys.stderr.write(f"error: the scaler configuration is invalid ({body['error']}):\n")
    for problem in str(body.get("detail", "")).split("; "):
        sys.stderr.write(f"  {problem}\n")
    raise typer.Exit(EXIT_USAGE)


FileArgument = Annotated[str, typer.Argument(help="A scalers.yaml file, or - for stdin.")]


@config_app.command("get")
def config_get(
    ctx: typer.Context,
    output: Annotated[str | None, typer.Option("-o", "--output", help="Write the YAML to this file.")] = None,
    json_output: JsonFlag = False,
) -> None:
    """Print the shared scalers.yaml (or write it to a file), with its version."""
    client = client_from(ctx, json_output)
    body = client.get("/scaler/config")
    if client.options.json_output:
        print_json(body)
        return
    if body.get("content") is None:
        typer.echo("no shared scaler configuration is stored")
        return
    if output:
        Path(output).write_text(body["content"], encoding="utf-8")
        typer.echo(f"shared scaler configuration version {body['version']} written to {output}")
        return
    typer.echo(f"# shared scaler configuration version {body['version']} (sha256 {body['sha256']})")
    typer.echo(body["content"], nl=not body["content"].endswith("\n"))


@config_app.command("set")
def config_set(ctx: typer.Context, file: FileArgument, json_output: JsonFlag = False) -> None:
    """Validate and store a scalers.yaml as the shared configuration; nodes without a local file reload it."""
    content = _read_content(file)
    client = client_from(ctx, json_output)
    body = client.request("PUT", "/scaler/config", json_body={"content": content}, answers=frozenset({422}))
    if "error" in body:
        _refused(body)
    if client.options.json_output:
        print_json(body)
        return
    if body["changed"]:
        typer.echo(
            f"shared scaler configuration stored as version {body['version']} "
            f"(cluster settings version {body['cluster_settings_version']})"
        )
    else:
        typer.echo(f"unchanged: version {body['version']} holds this configuration already")


@config_app.command("validate")
def config_validate(ctx: typer.Context, file: FileArgument, json_output: JsonFlag = False) -> None:
    """Check a scalers.yaml as `set` would, and store nothing."""
    content = _read_content(file)
    client = client_from(ctx, json_output)
    body = client.request(
        "POST", "/scaler/config/validate", json_body={"content": content}, answers=frozenset({422})
    )
    if "error" in body:
        _refused(body)
    if client.options.json_output:
        print_json(body)
        return
    typer.echo("valid: " + (", ".join(body["scalers"]) or "no scalers"))
