"""`conveyor admin support-bundle [--target ID|all] [-o FILE]` (docs/design/admin.md §8.1): write the
archive, then say what each node gave from its manifest."""

from __future__ import annotations

import json
import os
import sys
import tarfile
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from conveyor.cli.admin.client import EXIT_API, EXIT_USAGE, JsonFlag, client_from, fail, print_json

app = typer.Typer(
    rich_markup_mode=None,
    name="support-bundle",
    help="Collect every named node's recent logs, version, settings (secrets redacted), scaler, peer and "
    "database status into one tar.gz.",
    invoke_without_command=True,
)


def node_lines(document: dict[str, Any]) -> list[str]:
    """One line per node of a bundle's manifest."""
    lines = []
    for node in document["nodes"]:
        if node["outcome"] == "collected":
            why = f"{len(node['files'])} files, {node['bytes']} bytes"
        else:
            why = node["detail"]
        lines.append(f"{node['node']} ({node['role']}): {node['outcome']} ({why})")
    return lines


def read_manifest(path: Path) -> dict[str, Any]:
    """The `manifest.json` of a written bundle."""
    with tarfile.open(path, "r:gz") as archive:
        member = archive.extractfile("manifest.json")
        if member is None:
            raise KeyError("manifest.json")
        document: dict[str, Any] = json.load(member)
    return document


def _default_name() -> str:
    return "conveyor-support-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + ".tar.gz"


@app.callback()
def support_bundle(
    ctx: typer.Context,
    target: Annotated[
        str | None,
        typer.Option(
            "--target",
            help="Instance id of the node to collect from, or `all` (every node the answering coordinator "
            "knows); default: the one answering.",
        ),
    ] = None,
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            "-o",
            help="Where to write it (- for stdout). Default: ./conveyor-support-<time>.tar.gz.",
        ),
    ] = None,
    log_bytes: Annotated[
        int | None, typer.Option("--log-bytes", help="Newest log bytes per node (1 KiB–4 MiB; 1 MiB).")
    ] = None,
    timeout_ms: Annotated[
        int | None, typer.Option("--timeout-ms", help="How long each other node has to answer (ms).")
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Write the support bundle; exit 1 unless every named node's part is in it."""
    client = client_from(ctx, json_output)
    body = {"target": target, "log_bytes": log_bytes, "timeout_ms": timeout_ms}
    target_path = None if output == "-" else Path(output or _default_name())
    if target_path is not None and not target_path.parent.is_dir():
        fail(f"-o {output}: no directory {target_path.parent}", EXIT_USAGE)
    with client.stream("/support-bundle", method="POST", json_body=body) as response:
        if target_path is None:
            for chunk in response.iter_bytes():
                sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
            return
        size = _write(response.iter_bytes(), target_path)
    try:
        document = read_manifest(target_path)
    except (OSError, KeyError, tarfile.TarError, ValueError) as exc:
        fail(f"{target_path} is not a whole bundle ({exc}); try again", EXIT_API)
    if client.options.json_output:
        print_json(document)
    else:
        typer.echo("\n".join(node_lines(document)))
        typer.echo(f"wrote {target_path} ({size} bytes)")
    if any(node["outcome"] != "collected" for node in document["nodes"]):
        raise typer.Exit(1)


def _write(chunks: Any, target: Path) -> int:
    """Write beside `target`, then rename: a broken download leaves nothing at `target`."""
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    kept = False
    try:
        with os.fdopen(handle, "wb") as sink:
            size = 0
            for chunk in chunks:
                sink.write(chunk)
                size += len(chunk)
        os.chmod(temporary, 0o600)  # it holds logs and configuration: the caller's alone
        os.replace(temporary, target)
        kept = True
        return size
    except OSError as exc:
        fail(f"cannot write {target}: {exc.strerror or exc}", EXIT_API)
    finally:
        if not kept:
            Path(temporary).unlink(missing_ok=True)
