"""`conveyor admin cache list|delete` (docs/design/caches.md §7, docs/design/admin.md §7)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

import typer

from conveyor.cli.admin.client import JsonFlag, client_from, print_json, print_table
from conveyor.model.sizes import size_text

app = typer.Typer(
    rich_markup_mode=None,
    name="cache",
    help="Dependency cache entries: list them (cache.read), delete one (cache.manage).",
    no_args_is_help=True,
)


@app.command("list")
def list_caches(
    ctx: typer.Context,
    source: Annotated[str | None, typer.Option("--source", help="Only this source (its id or name).")] = None,
    key_prefix: Annotated[
        str | None, typer.Option("--key-prefix", help="Only keys starting with this.")
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Cache entries, most recently used first: id, key, branch scope, size, created, last used."""
    client = client_from(ctx, json_output)
    body = client.get("/caches", source=source, key_prefix=key_prefix)
    if client.options.json_output:
        print_json(body)
        return
    rows = [
        {
            "id": item["id"],
            "key": item["key"],
            "scope": item["scope"],
            "repo": item["repo"],
            "size": size_text(int(item["size"])),
            "created": item["created_at"],
            "last used": item["last_used_at"],
        }
        for item in body["items"]
    ]
    if not rows:
        typer.echo("no cache entries", err=True)
        return
    print_table(rows, ["id", "key", "scope", "repo", "size", "created", "last used"])
    typer.echo(f"{len(rows)} entries, {size_text(int(body['total_bytes']))}")


@app.command("delete")
def delete_cache(ctx: typer.Context, entry: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Delete one cache entry (the next run with its key misses and saves it again)."""
    client = client_from(ctx)
    client.request("DELETE", f"/caches/{quote(entry, safe='')}")
    typer.echo(f"deleted cache entry {entry}")
