"""Authoring commands: `init`, `compile`, `preview`, `fixture` (docs/design/authoring.md §6).

Exit codes: 0 ok, 1 failure, 2 usage or bad EVENT, 130 interrupted. Errors are one line on stderr.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer

from conveyor.cli import authoring_git as git
from conveyor.cli.authoring_events import (
    EventFlags,
    EventInvalid,
    EventUsageError,
    build_event,
    parse_event_spec,
)
from conveyor.cli.authoring_scaffold import (
    GITIGNORE,
    PRE_COMMIT_HOOK,
    REQUIREMENTS,
    example_workflow,
    scaffold_branch,
)
from conveyor.errors import ConveyorError

F = TypeVar("F", bound=Callable[..., Any])
LOCK_RELATIVE = Path(".conveyor") / "conveyor.lock.json"


class CommandFailed(ConveyorError):
    """An expected failure: print the message and exit with `exit_code`."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _fail(message: str, exit_code: int = 1) -> NoReturn:
    raise CommandFailed(message, exit_code)


def _one_line_errors(command: F) -> F:
    """Turn expected failures into `conveyor: message` on stderr and an exit code, never a traceback."""

    @wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except CommandFailed as failure:
            if str(failure):
                typer.echo(f"conveyor: {failure}", err=True)
            raise typer.Exit(failure.exit_code) from None
        except EventUsageError as error:
            typer.echo(f"conveyor: {error}", err=True)
            raise typer.Exit(2) from None
        except EventInvalid as error:
            typer.echo(f"conveyor: {error}", err=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            typer.echo("conveyor: interrupted", err=True)
            raise typer.Exit(130) from None

    return run  # type: ignore[return-value]


def _root(directory: Path | None) -> Path:
    if directory is not None:
        if not directory.is_dir():
            _fail(f"--dir {directory} is not a directory")
        return directory.resolve()
    return git.repository_root(Path.cwd()).resolve()


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def _compile(root: Path) -> Any:
    from conveyor.lockfile.compiler import compile_repository

    return compile_repository(root)


def _print_diagnostics(result: Any) -> None:
    for warning in result.warnings:
        typer.echo(f"warning: {warning}", err=True)
    for error in result.errors:
        typer.echo(str(error), err=True)


def init_command(
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite an existing .conveyor/ scaffold.")
    ] = False,
    no_example: Annotated[
        bool, typer.Option("--no-example", help="Do not write the example workflow.")
    ] = False,
    hook: Annotated[
        bool, typer.Option("--hook", help="Install a pre-commit hook running compile --check.")
    ] = False,
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Repository root (default: git top level).")
    ] = None,
) -> None:
    """Scaffold .conveyor/ with an example workflow, then compile the lock file."""
    _one_line_errors(_init)(force, no_example, hook, directory)


def _init(force: bool, no_example: bool, hook: bool, directory: Path | None) -> None:
    root = _root(directory)
    in_git = git.git_output(root, "rev-parse", "--git-dir") is not None
    if not in_git:
        typer.echo(
            f"warning: {root} is not a git repository: the server reads workflows from commits, so "
            "run `git init` here (then `conveyor init --force`) before adding it as a source",
            err=True,
        )
    conveyor_dir = root / ".conveyor"
    if conveyor_dir.exists() and not force:
        _fail(f"{conveyor_dir} already exists; use --force to overwrite the scaffold")
    (conveyor_dir / "workflows").mkdir(parents=True, exist_ok=True)
    (conveyor_dir / "fixtures").mkdir(exist_ok=True)
    (conveyor_dir / "fixtures" / ".gitkeep").touch()
    (conveyor_dir / ".gitignore").write_text(GITIGNORE, encoding="utf-8")
    requirements = conveyor_dir / "requirements.txt"
    if force or not requirements.exists():
        requirements.write_text(REQUIREMENTS, encoding="utf-8")
    if not no_example:
        branch = scaffold_branch(git.current_branch(root) if in_git else None, git.default_branch(root))
        (conveyor_dir / "workflows" / "ci.py").write_text(example_workflow(branch), encoding="utf-8")
        typer.echo(f"created .conveyor/workflows/ci.py (runs on pushes to {branch})")
    typer.echo("created .conveyor/.gitignore, .conveyor/requirements.txt, .conveyor/fixtures/")
    if hook:
        _install_hook(root)
    _compile_and_write(root, as_json=False)


def _install_hook(root: Path) -> None:
    hooks_dir = git.git_output(root, "rev-parse", "--git-path", "hooks")
    if hooks_dir is None:
        _fail("--hook needs a git repository")
    path = (root / hooks_dir) / "pre-commit"
    if path.exists():
        typer.echo(f"{path} already exists; add this line to it: conveyor compile --check", err=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PRE_COMMIT_HOOK, encoding="utf-8")
    path.chmod(0o755)
    typer.echo(f"installed {path.relative_to(root) if path.is_relative_to(root) else path}")


def compile_command(
    check: Annotated[
        bool, typer.Option("--check", help="Exit 1 if the committed lock is out of date.")
    ] = False,
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Repository root (default: git top level).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON report.")] = False,
) -> None:
    """Compile .conveyor/workflows/*.py into .conveyor/conveyor.lock.json."""
    _one_line_errors(_compile_cli)(check, directory, as_json)


def _json_report(result: Any, **extra: Any) -> str:
    return json.dumps(
        {
            "ok": result.ok,
            "errors": [item.as_dict() for item in result.errors],
            "warnings": [item.as_dict() for item in result.warnings],
            "workflows": [
                {
                    "name": s.name,
                    "file": s.file,
                    "triggers": s.triggers,
                    "jobs": s.jobs,
                    "content_hash": s.content_hash,
                }
                for s in result.summaries()
            ],
            **extra,
        },
        indent=2,
    )


def _compile_cli(check: bool, directory: Path | None, as_json: bool) -> None:
    root = _root(directory)
    if not check:
        _compile_and_write(root, as_json=as_json)
        return
    from conveyor.lockfile.compiler import lock_drift

    result = _compile(root)
    if not result.ok:
        _report_failure(result, as_json)
    lock_path = root / LOCK_RELATIVE
    committed = lock_path.read_bytes() if lock_path.is_file() else None
    if committed == result.lock_bytes:
        if as_json:
            typer.echo(_json_report(result, up_to_date=True))
        else:
            typer.echo("lock file is up to date")
        return
    drift = lock_drift(committed, result.lock)
    if as_json:
        typer.echo(
            _json_report(
                result,
                up_to_date=False,
                changed=list(drift.changed),
                added=list(drift.added),
                removed=list(drift.removed),
            )
        )
        raise CommandFailed("", 1)
    _fail(drift.describe())


def _report_failure(result: Any, as_json: bool) -> NoReturn:
    if as_json:
        typer.echo(_json_report(result))
    else:
        _print_diagnostics(result)
    raise CommandFailed("", 1)


def _compile_and_write(root: Path, *, as_json: bool) -> None:
    result = _compile(root)
    if not result.ok:
        _report_failure(result, as_json)
    lock_path = root / LOCK_RELATIVE
    if not lock_path.is_file() or lock_path.read_bytes() != result.lock_bytes:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(lock_path, result.lock_bytes)
    if as_json:
        typer.echo(_json_report(result))
        return
    for warning in result.warnings:
        typer.echo(f"warning: {warning}", err=True)
    for summary in result.summaries():
        typer.echo(
            f"{summary.name}  {summary.triggers} triggers  {summary.jobs} jobs  {summary.content_hash[:19]}"
        )
    typer.echo(f"wrote {LOCK_RELATIVE.as_posix()}")


FlagBranch = Annotated[str | None, typer.Option("--branch", help="Branch (default: current branch).")]
FlagTag = Annotated[str | None, typer.Option("--tag", help="Tag name for tag events.")]
FlagBase = Annotated[str | None, typer.Option("--base", help="PR base branch (default: default branch).")]
FlagHead = Annotated[str | None, typer.Option("--head", help="PR head branch (default: current branch).")]
FlagSha = Annotated[str | None, typer.Option("--sha", help="Commit sha (default: HEAD).")]
FlagFiles = Annotated[
    list[str] | None, typer.Option("--files", help="Changed files, comma separated; repeatable; '' = none.")
]
FlagNoFiles = Annotated[bool, typer.Option("--no-files", help="Changed files unknown (null).")]
FlagPayload = Annotated[Path | None, typer.Option("--payload", help="JSON object used as the payload.")]
FlagSet = Annotated[
    list[str] | None, typer.Option("--set", help="path=value inside the payload; repeatable.")
]
FlagEventFile = Annotated[Path | None, typer.Option("--event-file", help="A whole normalised event (JSON).")]
FlagInput = Annotated[list[str] | None, typer.Option("--input", help="Dispatch input k=v; repeatable.")]
FlagCron = Annotated[str | None, typer.Option("--cron", help="Which schedule of --workflow fires.")]
FlagWorkflow = Annotated[str | None, typer.Option("--workflow", help="Workflow to show (schedule: to fire).")]
FlagDir = Annotated[Path | None, typer.Option("--dir", help="Repository root (default: git top level).")]


def _flags(**values: Any) -> EventFlags:
    return EventFlags(
        branch=values["branch"],
        tag=values["tag"],
        base=values["base"],
        head=values["head"],
        sha=values["sha"],
        files=values["files"],
        no_files=values["no_files"],
        payload_file=values["payload"],
        set_values=values["set_values"] or [],
        event_file=values["event_file"],
        inputs=values["inputs"] or [],
        cron=values["cron"],
        workflow=values["workflow"],
    )


def preview_command(
    event: Annotated[
        str, typer.Argument(help="push, tag, pr[:ACTION], dispatch[:TYPE], schedule, event:NAME, ...")
    ],
    branch: FlagBranch = None,
    tag: FlagTag = None,
    base: FlagBase = None,
    head: FlagHead = None,
    sha: FlagSha = None,
    files: FlagFiles = None,
    no_files: FlagNoFiles = False,
    payload: FlagPayload = None,
    set_values: FlagSet = None,
    event_file: FlagEventFile = None,
    inputs: FlagInput = None,
    cron: FlagCron = None,
    workflow: FlagWorkflow = None,
    use_lock: Annotated[
        bool, typer.Option("--lock", help="Read the committed lock instead of compiling.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the decision trace as JSON.")] = False,
    directory: FlagDir = None,
) -> None:
    """Show which workflows an event would start, and why (nothing is executed)."""
    flags = _flags(**locals())
    _one_line_errors(_preview)(event, flags, use_lock, as_json, directory)


def _load_lock_for_preview(root: Path, use_lock: bool) -> Any:
    if use_lock:
        from conveyor.lockfile.errors import LockReadError
        from conveyor.lockfile.reader import load_lock

        try:
            return load_lock(root / LOCK_RELATIVE)
        except LockReadError as error:
            _fail(f"{error.code}: {error.message}")
    result = _compile(root)
    if not result.ok:
        _print_diagnostics(result)
        raise CommandFailed("", 1)
    return result.lock


def _preview(
    spec_text: str, flags: EventFlags, use_lock: bool, as_json: bool, directory: Path | None
) -> None:
    from conveyor.cli.authoring_render import render_preview, render_preview_json
    from conveyor.matching import match_workflows

    spec = parse_event_spec(spec_text)
    root = _root(directory)
    lock = _load_lock_for_preview(root, use_lock)
    event = build_event(spec, flags, root, lock)
    decision = match_workflows(lock, event)
    only = flags.workflow if spec.kind != "schedule" else None
    if only is not None and lock.workflow(only) is None:
        _fail(f"no workflow named {only!r}")
    if as_json:
        typer.echo(render_preview_json(decision, lock, event, only))
    else:
        typer.echo(render_preview(decision, lock, event, only))


def fixture_command(
    event: Annotated[
        str, typer.Argument(help="push, tag, pr[:ACTION], dispatch[:TYPE], schedule, event:NAME, ...")
    ],
    branch: FlagBranch = None,
    tag: FlagTag = None,
    base: FlagBase = None,
    head: FlagHead = None,
    sha: FlagSha = None,
    files: FlagFiles = None,
    no_files: FlagNoFiles = False,
    payload: FlagPayload = None,
    set_values: FlagSet = None,
    event_file: FlagEventFile = None,
    inputs: FlagInput = None,
    cron: FlagCron = None,
    workflow: FlagWorkflow = None,
    output: Annotated[
        Path | None, typer.Option("--output", help="Write to this file instead of stdout.")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite --output if it exists.")] = False,
    directory: FlagDir = None,
) -> None:
    """Print (or save) a complete normalised event with a realistic payload."""
    flags = _flags(**locals())
    _one_line_errors(_fixture)(event, flags, output, force, directory)


def _fixture(
    spec_text: str, flags: EventFlags, output: Path | None, force: bool, directory: Path | None
) -> None:
    spec = parse_event_spec(spec_text)
    root = _root(directory)
    lock = None
    if spec.kind == "schedule":
        lock = _load_lock_for_preview(root, use_lock=False)
    event = build_event(spec, flags, root, lock, forge_payload=True)
    text = json.dumps(event.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n"
    if output is None:
        sys.stdout.write(text)
        return
    if output.exists() and not force:
        _fail(f"{output} already exists; use --force to overwrite")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {output}")


def register(app: typer.Typer) -> None:
    """Attach the authoring commands to the top-level app."""
    app.command("init")(init_command)
    app.command("compile")(compile_command)
    app.command("preview")(preview_command)
    app.command("fixture")(fixture_command)
