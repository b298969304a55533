"""`conveyor admin artifact list|download` (docs/design/artifacts.md §7, docs/design/admin.md §7)."""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import IO, Annotated
from urllib.parse import quote, unquote

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
from conveyor.model.sizes import size_text

app = typer.Typer(
    rich_markup_mode=None,
    name="artifact",
    help="A run's artifacts: list them, download one, verify one's provenance (artifact.read).",
    no_args_is_help=True,
)

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_FILENAME_STAR = re.compile(r"filename\*\s*=\s*(?:UTF-8|utf-8)''([^;]+)")
_FILENAME = re.compile(r'filename\s*=\s*"?([^";]+)"?')


def expected_digest(etag: str | None) -> str | None:
    """The SHA-256 an artifact's `ETag` names (the quoted hex digest), or None when it names none."""
    if not etag:
        return None
    value = etag.strip().removeprefix("W/").strip('"').lower()
    return value if _SHA256.match(value) else None


def served_filename(content_disposition: str | None, artifact: str) -> str:
    """The file name to save a download under: the served one's last path part, never a path.

    The name was chosen by the job that uploaded the artifact, so anything that could leave the
    directory (`..`, separators) is dropped; without a usable name the artifact's name (which the
    server restricts to `[A-Za-z0-9._-]`) is used.
    """
    found = None
    if content_disposition:
        match = _FILENAME_STAR.search(content_disposition) or _FILENAME.search(content_disposition)
        if match:
            found = unquote(match.group(1).strip())
    name = PurePosixPath((found or "").replace("\\", "/")).name
    if name in ("", ".", "..") or "\x00" in name:
        return artifact
    return name


def destination(output: str | None, filename: str) -> Path:
    """Where a download is saved: `./<filename>`, `-o DIR/<filename>` for a directory, else `-o PATH`."""
    if output is None:
        return Path(filename)
    path = Path(output)
    return path / filename if path.is_dir() else path


@app.command("list")
def list_artifacts(
    ctx: typer.Context, run: Annotated[str, typer.Argument(metavar="RUN")], json_output: JsonFlag = False
) -> None:
    """A run's artifacts, oldest first: name, size, the job that made it, when."""
    client = client_from(ctx, json_output)
    body = client.get(f"/runs/{quote(run, safe='')}/artifacts")
    if client.options.json_output:
        print_json(body)
        return
    rows = [
        {
            "name": item["name"],
            "size": size_text(int(item["size"])),
            "job": item.get("job") or item.get("job_id"),
            "created": item.get("created_at"),
        }
        for item in body["items"]
    ]
    if not rows:
        typer.echo(f"run {run} has no artifacts", err=True)
        return
    print_table(rows, ["name", "size", "job", "created"])


@app.command("download")
def download(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN")],
    name: Annotated[str, typer.Argument(metavar="NAME")],
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            "-o",
            help="Where to write it: a file (replaced if it exists), a directory, or - for stdout. "
            "Default: ./<the file name the server gives>.",
        ),
    ] = None,
) -> None:
    """Download an artifact; its SHA-256 is checked against the server's before the file is kept."""
    if output not in (None, "-"):
        parent = Path(output) if Path(output).is_dir() else Path(output).parent
        if not parent.is_dir():
            fail(f"-o {output}: no directory {parent}", EXIT_USAGE)
    client = client_from(ctx)
    path = f"/runs/{quote(run, safe='')}/artifacts/{quote(name, safe='')}/content"
    with client.stream(path) as response:
        expected = expected_digest(response.headers.get("etag"))
        if expected is None:
            fail(
                f"the server sent no SHA-256 for artifact {name!r} (ETag), so it cannot be checked", EXIT_API
            )
        length = response.headers.get("content-length")
        total = int(length) if length and length.isdigit() else None
        if output == "-":
            _receive(response.iter_bytes(), sys.stdout.buffer, expected, total, name, target=None)
            sys.stdout.flush()
            return
        target = destination(output, served_filename(response.headers.get("content-disposition"), name))
        size = _receive_to_file(response.iter_bytes(), target, expected, total, name)
    typer.echo(f"saved {target} ({size_text(size)}, sha256 {expected})")


def _receive_to_file(
    chunks: Iterator[bytes], target: Path, expected: str, total: int | None, name: str
) -> int:
    """Write the bytes to a temporary file beside `target`, then rename it there once they are whole
    and checked: a broken or wrong download leaves nothing behind, and never half a file at `target`."""
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    except OSError as exc:
        fail(f"cannot write in {target.parent}: {exc.strerror or exc}", EXIT_USAGE)
    kept = False
    try:
        with os.fdopen(handle, "wb") as sink:
            size = _receive(chunks, sink, expected, total, name, target=target)
        os.replace(temporary, target)
        kept = True
        return size
    except OSError as exc:
        fail(f"cannot write {target}: {exc.strerror or exc}", EXIT_API)
    finally:
        if not kept:
            Path(temporary).unlink(missing_ok=True)


def _receive(
    chunks: Iterator[bytes],
    sink: IO[bytes],
    expected: str,
    total: int | None,
    name: str,
    *,
    target: Path | None,
) -> int:
    """Copy the body into `sink`, hashing it; fail (exit 1) when it breaks or its digest is not `expected`."""
    import httpx

    digest = hashlib.sha256()
    received = 0
    gone = "" if target is None else f"; nothing was kept at {target}"
    with _progress(name, total) as advance:
        try:
            for chunk in chunks:
                digest.update(chunk)
                sink.write(chunk)
                received += len(chunk)
                advance(len(chunk))
        except httpx.HTTPError as exc:
            of = f" of {total}" if total is not None else ""
            fail(f"the download of {name!r} broke after {received}{of} bytes ({exc}){gone}", EXIT_API)
    if digest.hexdigest() != expected:
        fail(
            f"artifact {name!r}: the SHA-256 of the {received} bytes received is {digest.hexdigest()}, "
            f"not the server's {expected}{gone}",
            EXIT_API,
        )
    return received


@contextmanager
def _progress(name: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr when it is a terminal; nothing otherwise (pipes, logs, scripts)."""
    if not sys.stderr.isatty():
        yield lambda _count: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
    ) as bar:
        task = bar.add_task(name, total=total)
        yield lambda count: bar.advance(task, count)


@app.command("verify")
def verify(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN")],
    name: Annotated[str, typer.Argument(metavar="NAME")],
    json_output: JsonFlag = False,
) -> None:
    """Check an artifact's stored bytes against its signed provenance (docs/design/artifacts.md §9).

    The server verifies the statement's signature, its subject against the artifact and the blob's bytes
    against its digest; this command checks the envelope's signature again with the public key it names.
    Exit 1 naming each problem when anything disagrees.
    """
    from conveyor.artifacts.provenance import EnvelopeInvalid, statement_problems, verify_envelope

    client = client_from(ctx, json_output)
    body = client.get(f"/runs/{quote(run, safe='')}/artifacts/{quote(name, safe='')}/provenance/verify")
    problems = list(body.get("problems") or [])
    if body.get("public_key") and body.get("envelope"):
        try:
            checked = verify_envelope(body["envelope"], {body["key_id"]: body["public_key"]})
        except EnvelopeInvalid as exc:
            problems.append(f"this client's check of the signature failed: {exc}")
        else:
            stored = body.get("stored_sha256") or ""
            for problem in statement_problems(checked.statement, name=name, sha256=stored, run_id=run):
                if problem not in problems:
                    problems.append(f"this client's check: {problem}")
    elif not problems:
        problems.append("the server sent no public key or envelope to check")
    if client.options.json_output:
        print_json({**body, "verified": not problems, "problems": problems})
    else:
        subject = body.get("subject") or {}
        parameters = body.get("external_parameters") or {}
        print_fields(
            {
                "artifact": name,
                "run": run,
                "subject sha256": (subject.get("digest") or {}).get("sha256"),
                "stored sha256": body.get("stored_sha256"),
                "key id": body.get("key_id"),
                "builder": body.get("builder_id"),
                "build type": body.get("build_type"),
                "source": parameters.get("source"),
                "repository": parameters.get("repository"),
                "commit": parameters.get("commit"),
                "workflow": parameters.get("workflow"),
                "job": parameters.get("job"),
                "started": body.get("started_on"),
                "finished": body.get("finished_on"),
                "minted": body.get("minted_at"),
            }
        )
    if problems:
        fail(
            f"artifact {name} of run {run} does NOT match its provenance:\n  " + "\n  ".join(problems),
            EXIT_API,
        )
    if not client.options.json_output:
        typer.echo(f"verified: artifact {name} matches its provenance signed by key {body.get('key_id')}")
