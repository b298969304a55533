"""`conveyor run local EVENT …`: run matched jobs here with the agent's runner (docs/design/authoring.md §6).

Exit codes: 0 every job `success` or `skipped`; 1 a job failed, nothing matched or a compile error; 2 usage or
bad EVENT; 130 interrupted twice (forced).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any
from xml.etree import ElementTree

import typer

from conveyor.cli import authoring_git as git
from conveyor.cli.authoring import (
    CommandFailed,
    FlagBase,
    FlagBranch,
    FlagCron,
    FlagEventFile,
    FlagFiles,
    FlagHead,
    FlagInput,
    FlagNoFiles,
    FlagPayload,
    FlagSet,
    FlagSha,
    FlagTag,
    _one_line_errors,
)
from conveyor.cli.authoring_events import EventFlags, build_event, parse_event_spec

app = typer.Typer(
    rich_markup_mode=None, name="run", help="Run workflows without a server.", no_args_is_help=True
)

STATUS_MARKS = {"success": "✓", "failed": "✗", "timed_out": "⏱", "cancelled": "■", "skipped": "-"}


def _key_values(items: list[str] | None, what: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for item in items or []:
        name, separator, value = item.partition("=")
        if not separator or not name:
            raise CommandFailed(f"{what} expects KEY=VALUE, got {item!r}", 2)
        values[name] = value
    return values


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "conveyor" / "venvs"


class TextReporter:
    """Live `[job (matrix)] line` output and a summary table at the end."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def _json(self, kind: str, job: Any, step: str | None = None, /, **fields: Any) -> None:
        record = {
            "ts": int(time.time() * 1000),
            "kind": kind,
            "workflow": job.workflow.name,
            "job": job.label,
        }
        record.update({"step": step, **fields})
        sys.stdout.write(json.dumps(record, default=str) + "\n")
        sys.stdout.flush()

    def log(self, job: Any, step: str, stream: str, text: str) -> None:
        if self.as_json:
            self._json("log", job, step, stream=stream, text=text)
            return
        prefix = "[conveyor] " if stream == "sys" else ""
        typer.echo(f"[{job.label}] {prefix}{text}")

    def step(self, job: Any, message: Any) -> None:
        if self.as_json:
            fields = {k: v for k, v in message.items() if k not in ("type", "job_id", "name", "kind")}
            self._json(
                "step", job, message["name"], event=message["type"], step_kind=message["kind"], **fields
            )
            return
        if message["type"] == "step.started":
            typer.echo(f"[{job.label}] ▶ {message['name']}")
        else:
            mark = STATUS_MARKS.get(message["status"], "?")
            detail = f" ({message['reason']})" if message.get("reason") else ""
            typer.echo(f"[{job.label}] {mark} {message['name']} {message['status']}{detail}")

    def job(self, job: Any) -> None:
        if self.as_json:
            self._json("job", job, status=job.status, reason=job.reason, error=job.error, outputs=job.outputs)
            return
        detail = f" ({job.reason})" if job.reason else ""
        typer.echo(f"[{job.label}] job {job.status}{detail}")

    def event(self, job: Any, name: str, payload: Any) -> None:
        if self.as_json:
            self._json("event", job, name=name, payload=payload)
            return
        typer.echo(
            f"[{job.label}] [conveyor] event {name!r} emitted (recorded, not delivered): {json.dumps(payload)}"
        )


def summary_table(jobs: list[Any]) -> str:
    """One row per step of each job (jobs that never ran get one row), aligned in columns."""
    rows = [("WORKFLOW", "JOB", "STEP", "STATUS", "DURATION", "DETAIL")]
    for job in jobs:
        steps = [s for s in job.steps if s["kind"] != "setup" or s["status"] != "success"]
        if not steps:
            rows.append((job.workflow.name, job.label, "-", job.status or "?", "", job.reason or ""))
        for step in steps:
            detail = step.get("reason") or ""
            if step.get("error") and step["status"] not in ("success", "skipped"):
                detail = f"{detail}: {step['error']}".strip(": ").splitlines()[0][:80]
            rows.append(
                (
                    job.workflow.name,
                    job.label,
                    step["name"],
                    step["status"],
                    f"{step.get('duration_ms', 0) / 1000:.1f}s",
                    detail,
                )
            )
        if steps:
            rows.append(
                (
                    job.workflow.name,
                    job.label,
                    "(job)",
                    job.status or "?",
                    f"{job.duration_ms / 1000:.1f}s",
                    job.reason or "",
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def write_junit(path: Path, jobs: list[Any]) -> None:
    """One testsuite per job, one testcase per step."""
    suites = ElementTree.Element("testsuites")
    for job in jobs:
        suite = ElementTree.SubElement(suites, "testsuite", name=f"{job.workflow.name}/{job.label}")
        for step in job.steps:
            case = ElementTree.SubElement(
                suite,
                "testcase",
                name=step["name"],
                classname=job.label,
                time=f"{step.get('duration_ms', 0) / 1000:.3f}",
            )
            if step["status"] == "skipped":
                ElementTree.SubElement(case, "skipped", message=step.get("reason") or "skipped")
            elif step["status"] != "success":
                failure = ElementTree.SubElement(
                    case, "failure", message=step.get("reason") or step["status"]
                )
                failure.text = step.get("error") or ""
        suite.set("tests", str(len(job.steps)))
    ElementTree.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)


@app.command("local")
def local_command(
    event: Annotated[
        str, typer.Argument(help="push, tag, pr[:ACTION], dispatch[:TYPE], schedule, @NAME, ...")
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
    workflows: Annotated[
        list[str] | None, typer.Option("--workflow", help="Only these workflows; repeatable.")
    ] = None,
    jobs: Annotated[
        list[str] | None, typer.Option("--job", help="Only these jobs (and their needs); repeatable.")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Run the --workflow workflows even if nothing matched.")
    ] = False,
    secrets: Annotated[
        list[str] | None, typer.Option("--secret", help="K=V secret; repeatable; wins over the file.")
    ] = None,
    secrets_file: Annotated[
        Path | None, typer.Option("--secrets-file", help="Default .conveyor/.secrets.")
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", help="K=V standing in for org variables; repeatable.")
    ] = None,
    labels: Annotated[
        list[str] | None, typer.Option("--label", help="Extra local agent label; repeatable.")
    ] = None,
    ignore_labels: Annotated[
        bool, typer.Option("--ignore-labels", help="Run jobs whatever their runs_on.")
    ] = False,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Jobs at once.")] = 1,
    in_place: Annotated[
        bool, typer.Option("--in-place", help="Run in the repository itself (concurrency 1).")
    ] = False,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the job workspaces.")] = False,
    cache_dir: Annotated[
        Path | None,
        typer.Option("--cache-dir", help="Where ctx.cache keeps entries (default ~/.cache/conveyor/caches)."),
    ] = None,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="Fail (lock_out_of_date, exit 1) when the committed lock is out of date, as a server.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines instead of text.")] = False,
    junit: Annotated[Path | None, typer.Option("--junit", help="Write a JUnit XML report here.")] = None,
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Repository root (default: git top level).")
    ] = None,
) -> None:
    """Match EVENT against the working tree's workflows and run the matched jobs on this machine."""
    flags = EventFlags(
        branch=branch,
        tag=tag,
        base=base,
        head=head,
        sha=sha,
        files=files,
        no_files=no_files,
        payload_file=payload,
        set_values=set_values or [],
        event_file=event_file,
        inputs=inputs or [],
        cron=cron,
        workflow=workflows[0] if workflows else None,
    )
    options = {
        "workflows": workflows or [],
        "jobs": jobs or [],
        "force": force,
        "secrets": secrets,
        "secrets_file": secrets_file,
        "env": env,
        "labels": labels or [],
        "ignore_labels": ignore_labels,
        "concurrency": concurrency,
        "in_place": in_place,
        "keep": keep,
        "cache_dir": cache_dir,
        "strict": strict,
        "as_json": as_json,
        "junit": junit,
    }
    _one_line_errors(_run_local)(event, flags, directory, options)


def _run_local(event_text: str, flags: EventFlags, directory: Path | None, options: dict[str, Any]) -> None:
    from conveyor.agent.local import (
        LocalOptions,
        LocalRun,
        exit_code,
        local_labels,
        parse_secrets_file,
        select_jobs,
    )
    from conveyor.cli.authoring_render import render_preview
    from conveyor.lockfile.compiler import compile_repository, lock_drift
    from conveyor.matching import match_workflows, plan_workflow

    spec = parse_event_spec(event_text)
    root = directory.resolve() if directory else git.repository_root(Path.cwd()).resolve()
    result = compile_repository(root)
    if not result.ok or result.lock is None:
        for error in result.errors:
            typer.echo(str(error), err=True)
        raise CommandFailed("", 1)
    lock = result.lock
    lock_path = root / ".conveyor" / "conveyor.lock.json"
    committed = lock_path.read_bytes() if lock_path.is_file() else None
    if committed != result.lock_bytes:
        drift = lock_drift(committed, lock).describe()
        if options["strict"]:
            raise CommandFailed(f"lock_out_of_date: {drift} (a server would fail this run)", 1)
        typer.echo(stale_lock_banner(drift), err=True)
    event = build_event(spec, flags, root, lock)
    decision = match_workflows(lock, event)
    wanted = set(options["workflows"])
    for name in wanted:
        if lock.workflow(name) is None:
            raise CommandFailed(f"no workflow named {name!r}")
    selected = [
        item.workflow
        for item in decision.workflows
        if (item.matched and (not wanted or item.workflow in wanted))
        or (options["force"] and item.workflow in wanted)
    ]
    local_jobs = []
    for name in selected:
        entry = lock.workflow(name)
        assert entry is not None
        local_jobs.extend(select_jobs(entry, plan_workflow(entry, event).jobs, options["jobs"]))
    if not local_jobs:
        typer.echo(render_preview(decision, lock, event, None), err=True)
        raise CommandFailed("nothing to run", 1)
    secrets_path = options["secrets_file"] or root / ".conveyor" / ".secrets"
    try:
        sections = (
            parse_secrets_file(secrets_path.read_text(encoding="utf-8")) if secrets_path.is_file() else {}
        )
    except ValueError as error:
        raise CommandFailed(f"{secrets_path}: {error}") from None
    if options["secrets_file"] and not secrets_path.is_file():
        raise CommandFailed(f"--secrets-file {secrets_path} not found", 2)
    run_options = LocalOptions(
        secrets=sections,
        secret_overrides=_key_values(options["secrets"], "--secret"),
        env=_key_values(options["env"], "--env"),
        labels=local_labels(options["labels"]),
        ignore_labels=options["ignore_labels"],
        concurrency=options["concurrency"],
        in_place=options["in_place"],
        keep=options["keep"],
        venvs_dir=_cache_dir(),
        cache_dir=options["cache_dir"] or _cache_dir().parent / "caches",
    )
    reporter = TextReporter(options["as_json"])
    run = LocalRun(root, event, local_jobs, run_options, reporter)
    import asyncio

    finished = asyncio.run(_execute(run))
    if options["keep"]:
        typer.echo(f"workspaces kept in {run.directory}", err=True)
    if options["junit"] is not None:
        write_junit(options["junit"], finished)
    code = exit_code(finished)
    if options["as_json"]:
        sys.stdout.write(
            json.dumps(
                {"ts": int(time.time() * 1000), "kind": "run", "status": "success" if code == 0 else "failed"}
            )
            + "\n"
        )
    else:
        typer.echo("")
        typer.echo(summary_table(finished))
    if run.forced:
        raise CommandFailed("interrupted", 130)
    if code:
        raise CommandFailed("", code)


def stale_lock_banner(drift: str) -> str:
    """The warning `run local` prints when the committed lock is out of date: framed, so it stands out
    among job output, and saying what a server would do with this commit."""
    lines = [
        "WARNING: the committed lock file is out of date; running the working tree's workflows anyway.",
        drift,
        "A server would fail this commit's runs with lock_out_of_date: run `conveyor compile`, commit",
        "the lock, or pass --strict to fail here as the server would.",
    ]
    rule = "!" * min(100, max(len(line) for line in lines) + 4)
    return "\n".join([rule, *(f"! {line}" for line in lines), rule])


async def _execute(run: Any) -> Any:
    import asyncio

    loop = asyncio.get_running_loop()
    # Ctrl-C cancels gracefully (on_cancel, cleanup); a second Ctrl-C forces.
    loop.add_signal_handler(signal.SIGINT, run.cancel)
    try:
        return await run.run()
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def register(root: typer.Typer) -> None:
    """Attach `conveyor run …` to the top-level app."""
    root.add_typer(app)
