"""`conveyor admin secret set|list|rm|rotate-key|rotation-status` (docs/design/admin.md §6, §7).

A value is read from `--value-file`, `--from-env` or stdin (without echo on a terminal), never from
an argument, so it stays out of shell history and `ps`. It is sent once and never printed: the API
answers metadata only. File and piped values are taken byte for byte (a trailing newline is kept);
use `printf '%s' "$VALUE" |` rather than `echo`.
"""

from __future__ import annotations

import getpass
import os
import sys
from pathlib import Path
from typing import Annotated
from urllib.parse import quote

import typer

from conveyor.cli.admin.client import (
    EXIT_USAGE,
    AllPagesOption,
    CursorOption,
    JsonFlag,
    client_from,
    fail,
    print_fields,
    print_json,
    print_next,
    print_table,
)
from conveyor.cli.confirm import confirm_destructive

app = typer.Typer(
    rich_markup_mode=None,
    name="secret",
    help="Encrypted secrets (values are never shown).",
    no_args_is_help=True,
)

_META_COLUMNS = ["scope", "name", "key_version", "updated_at", "updated_by"]


def secret_path(scope: str, name: str) -> str:
    """`/secrets/{scope}/{name}` with the scope percent-encoded (it may hold `/` and `:`)."""
    return f"/secrets/{quote(scope, safe='')}/{quote(name, safe='')}"


def read_value(value_file: Path | None, from_env: str | None) -> str:
    """The value from exactly one source: a file, an environment variable, or stdin."""
    if value_file is not None and from_env is not None:
        fail("give --value-file or --from-env, not both", EXIT_USAGE)
    if value_file is not None:
        try:
            return value_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"cannot read {value_file}: {exc}", EXIT_USAGE)
    if from_env is not None:
        value = os.environ.get(from_env)
        if value is None:
            fail(f"environment variable {from_env} is not set", EXIT_USAGE)
        return value
    if sys.stdin.isatty():
        return getpass.getpass("value (not echoed): ")
    return sys.stdin.read()


@app.command("set")
def set_secret(
    ctx: typer.Context,
    scope: Annotated[str, typer.Argument(help="org, env/<environment> or source:<id>.")],
    name: Annotated[str, typer.Argument(help="Secret name, e.g. DEPLOY_TOKEN.")],
    value_file: Annotated[
        Path | None, typer.Option("--value-file", help="Read the value from this file.")
    ] = None,
    from_env: Annotated[
        str | None, typer.Option("--from-env", help="Read the value from this environment variable.")
    ] = None,
    json_output: JsonFlag = False,
    stray: Annotated[list[str] | None, typer.Argument(hidden=True, show_default=False)] = None,
) -> None:
    """Create or replace a secret; the value comes from --value-file, --from-env or stdin."""
    if stray:
        # Caught here rather than by click, whose usage error would echo the value back.
        fail(
            "a secret value is never taken from an argument (it would stay in shell history); "
            "use --value-file, --from-env or stdin",
            EXIT_USAGE,
        )
    value = read_value(value_file, from_env)
    client = client_from(ctx, json_output)
    meta = client.request("PUT", secret_path(scope, name), json_body={"value": value})
    if client.options.json_output:
        print_json(meta)
        return
    typer.echo(f"set {meta['scope']} {meta['name']} (key version {meta['key_version']})")


@app.command("list")
def list_secrets(
    ctx: typer.Context,
    scope: Annotated[str | None, typer.Argument(help="Only this scope.")] = None,
    all_pages: AllPagesOption = False,
    cursor: CursorOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Secret names and metadata (never values)."""
    client = client_from(ctx, json_output)
    page = client.paged("/secrets", follow=all_pages, cursor=cursor, scope=scope)
    if client.options.json_output:
        print_json(page)
        return
    for item in page["items"]:
        item["updated_by"] = item.get("updated_by_name") or item.get("updated_by")
    print_table(page["items"], _META_COLUMNS)
    print_next(client, page)


@app.command("rm")
def remove(
    ctx: typer.Context,
    scope: Annotated[str, typer.Argument()],
    name: Annotated[str, typer.Argument()],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
) -> None:
    """Delete a secret."""
    confirm_destructive(f"delete secret {name} of scope {scope}?", yes)
    client_from(ctx).request("DELETE", secret_path(scope, name))
    typer.echo(f"deleted {scope} {name}")


@app.command("rotate-key")
def rotate_key(ctx: typer.Context, json_output: JsonFlag = False) -> None:
    """Re-encrypt every secret under the current master key (resumable; a rerun is a no-op)."""
    client = client_from(ctx, json_output)
    result = client.request("POST", "/secrets/rotate-key")
    if client.options.json_output:
        print_json(result)
        return
    moved = ", ".join(f"{table} {count}" for table, count in result["reencrypted"].items())
    typer.echo(f"key version {result['version']}: re-encrypted {moved}; {result['remaining']} remaining")


@app.command("rotation-status")
def rotation_status(ctx: typer.Context, json_output: JsonFlag = False) -> None:
    """Rows per key version; remove an old key once its version shows 0 rows."""
    client = client_from(ctx, json_output)
    status = client.get("/secrets/rotation")
    if client.options.json_output:
        print_json(status)
        return
    print_fields(
        {
            "current_version": status["current_version"],
            "current_fingerprint": status["current_fingerprint"],
            "node_fingerprint": status["node_fingerprint"],
            "rows_on_old_versions": status["rows_on_old_versions"],
            "in_progress": status["in_progress"],
        }
    )
    rows = [
        {**v, "current": "yes" if v["current"] else "", "held": "yes" if v["held"] else "no"}
        for v in status["versions"]
    ]
    print_table(rows, ["version", "fingerprint", "current", "held", "total", "created_at"])
