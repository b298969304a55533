"""`conveyor admin run list|show|start|logs|cancel|rerun`."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer

from conveyor.cli.admin.client import (
    EXIT_NOT_FOUND,
    EXIT_RUN_NOT_SUCCESSFUL,
    EXIT_USAGE,
    AdminClient,
    AllPagesOption,
    CursorOption,
    JsonFlag,
    LimitOption,
    client_from,
    fail,
    print_fields,
    print_json,
    print_next,
    print_table,
)

app = typer.Typer(
    rich_markup_mode=None, name="run", help="Runs, their jobs and why they started.", no_args_is_help=True
)


@app.command("list")
def list_runs(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option("--status")] = None,
    workflow: Annotated[str | None, typer.Option("--workflow")] = None,
    routing_key: Annotated[str | None, typer.Option("--routing-key")] = None,
    ref: Annotated[
        str | None,
        typer.Option("--ref", help="A branch or tag name (main), or a full ref (refs/heads/main)."),
    ] = None,
    since: Annotated[str | None, typer.Option("--since")] = None,
    limit: LimitOption = 50,
    all_pages: AllPagesOption = False,
    cursor: CursorOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Runs, newest first."""
    client = client_from(ctx, json_output)
    page = client.paged(
        "/runs",
        follow=all_pages,
        cursor=cursor,
        status=status,
        workflow=workflow,
        routing_key=routing_key,
        ref=ref,
        since=since,
        limit=limit,
    )
    if client.options.json_output:
        print_json(page)
        return
    from conveyor.model.durations import duration_text

    for row in page["items"]:
        row["run"] = f"#{row['number']}"
        row["source"] = row.get("routing_key")
        row["duration"] = duration_text(row.get("started_at"), row.get("finished_at"))
        row["reason"] = row.get("ended_because") or row.get("reason")
    print_table(
        page["items"],
        ["id", "workflow", "run", "status", "source", "ref", "sha", "created_at", "duration", "reason"],
    )
    print_next(client, page)


@app.command("show")
def show(
    ctx: typer.Context, run: Annotated[str, typer.Argument(metavar="RUN")], json_output: JsonFlag = False
) -> None:
    """A run with its jobs and the decision that created it."""
    client = client_from(ctx, json_output)
    body = client.get(f"/runs/{run}")
    if client.options.json_output:
        print_json(body)
        return
    jobs = body.pop("jobs", [])
    trace = body.pop("trigger_trace", None)
    waiting = body.pop("pending_approvals", None) or []
    body.pop("event", None)
    summoned_by, summoned = body.pop("summoned_by", None), body.pop("summoned", None) or []
    print_fields(body)
    for line in approval_lines(waiting):
        typer.echo(line)
    for line in summon_lines(summoned_by, summoned, jobs):
        typer.echo(line)
    for job in jobs:
        job["reroutes"] = describe_reroutes(job)
    print_table(
        jobs,
        ["display_name", "status", "reason", "agent_id", "reroutes", "started_at", "finished_at"],
        title="jobs",
    )
    caches = cache_lines(jobs)
    if caches:
        typer.echo("caches:")
        for line in caches:
            typer.echo(line)
    reports = client.try_get(f"/runs/{run}/test-reports")
    if reports and reports.get("items"):
        typer.echo("test reports:")
        for line in report_lines(reports["items"]):
            typer.echo(line)
    if trace:
        from conveyor.cli.authoring_render import render_run_trace

        typer.echo("why it ran:")
        typer.echo(render_run_trace(trace))


def summon_lines(
    summoned_by: dict[str, Any] | None, summoned: list[dict[str, Any]], jobs: list[dict[str, Any]]
) -> list[str]:
    """Both directions of a run's summon links (docs/design/execution.md §8.6), pure: `summoned by: run <id>
    (<workflow> #N), job <id>` and `summoned: run <id> (<workflow> #N) <status> by job <name>` per child."""
    lines = []
    if summoned_by:
        lines.append(
            f"summoned by: run {summoned_by['run_id']} ({summoned_by.get('workflow')} #{summoned_by.get('number')}),"
            f" job {summoned_by.get('job_id')}"
        )
    names = {j.get("id"): j.get("display_name") or j.get("name") for j in jobs}
    for child in summoned:
        lines.append(
            f"summoned: run {child['run_id']} ({child.get('workflow')} #{child.get('number')})"
            f" {child.get('status')} by job {names.get(child.get('job_id'), child.get('job_id'))}"
        )
    return lines


def approval_lines(waiting: list[dict[str, Any]]) -> list[str]:
    """`waiting for approval: <job> …` per held job, saying who may release it (pure)."""
    return [
        f"waiting for approval: {w['display_name']} (environment {w['environment']}; "
        f"approvers: {', '.join(w.get('approvers') or []) or 'anyone with run.approve'})"
        for w in waiting
    ]


def waiting_jobs(jobs: list[dict[str, Any]], wanted: str | None) -> list[dict[str, Any]]:
    """The jobs `run approve|reject` decides: the one named by id or display name, else every waiting
    job (pure); a named job is returned whatever its status, so the server says why it cannot be decided."""
    if wanted is not None:
        return [j for j in jobs if wanted in (j.get("id"), j.get("display_name"), j.get("name"))][:1]
    return [j for j in jobs if j.get("status") == "waiting_approval"]


def cache_lines(jobs: list[dict[str, Any]]) -> list[str]:
    """What each step's caches did (docs/design/caches.md §7): `  JOB / STEP: KEY: miss, saved 1.2 KiB`."""
    from conveyor.model.caches import step_cache_text

    lines: list[str] = []
    for job in jobs:
        for step in job.get("steps") or []:
            for record in step.get("caches") or []:
                where = f"{job.get('display_name') or job.get('name')} / {step.get('name')}"
                lines.append(f"  {where}: {step_cache_text(record)}")
    return lines


def report_lines(reports: list[dict[str, Any]]) -> list[str]:
    """Each JUnit summary of a run (docs/design/artifacts.md §7): its counts, then its failing tests.

    The server keeps at most 50 failing tests a report; the rest are counted, not named.
    """
    lines: list[str] = []
    for report in reports:
        counts = f"{report['passed']} passed, {report['failed']} failed, {report['skipped']} skipped"
        if report.get("errors"):
            counts += f", {report['errors']} errors"
        job = f" (job {report['job']})" if report.get("job") else ""
        lines.append(f"  {report['artifact']}{job}: {counts}")
        failures = report.get("failures") or []
        for failure in failures:
            message = f": {failure['message']}" if failure.get("message") else ""
            lines.append(f"    FAILED {failure['name']}{message}")
        unnamed = int(report["failed"]) + int(report.get("errors") or 0) - len(failures)
        if unnamed > 0:
            lines.append(f"    … and {unnamed} more failing")
    return lines


def describe_reroutes(job: dict[str, Any]) -> str:
    """The job's reroutes in one cell: the worker it runs on and the hop, the workers tried, and each
    ended offer with its reason (`w1 hop 1: rejected (no-capacity)`); empty for a job never rerouted."""
    parts: list[str] = []
    if job.get("rerouted_to"):
        parts.append(f"on {job['rerouted_to']} hop {job.get('reroute_hop') or 1}")
    tried = list(job.get("reroute_tried") or [])[1:]  # the first is the offering coordinator
    if tried:
        parts.append("tried " + ", ".join(tried))
    for entry in job.get("reroutes") or []:
        hop = f" hop {entry['hop']}" if entry.get("hop") is not None else ""
        parts.append(f"{entry['worker']}{hop}: {entry['outcome']} ({entry.get('reason') or 'no reason'})")
    return "; ".join(parts)


def _parse_inputs(values: list[str]) -> dict[str, Any]:
    inputs: dict[str, Any] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--input {item!r} is not KEY=VALUE", EXIT_USAGE)
        inputs[key] = value
    return inputs


@app.command("start")
def start(
    ctx: typer.Context,
    source: Annotated[str, typer.Option("--source")],
    workflow: Annotated[str, typer.Option("--workflow")],
    ref: Annotated[str | None, typer.Option("--ref")] = None,
    inputs: Annotated[list[str] | None, typer.Option("--input", help="KEY=VALUE, repeatable.")] = None,
    json_output: JsonFlag = False,
) -> None:
    """Start a workflow through its dispatch trigger."""
    client = client_from(ctx, json_output)
    body = {"source": source, "workflow": workflow, "ref": ref, "inputs": _parse_inputs(inputs or [])}
    run = client.request("POST", "/runs", json_body={k: v for k, v in body.items() if v is not None})
    if client.options.json_output:
        print_json(run)
    else:
        typer.echo(f"started run {run['id']}")


LOG_POLL_S = 0.5
LOG_PAGE_BYTES = 65_536


@app.command("logs")
def logs(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN")],
    job: Annotated[str | None, typer.Option("--job", help="A job id, name or display name.")] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Keep printing until the run (or --job) ends; exit 5 unless it succeeded."
        ),
    ] = False,
) -> None:
    """A run's job logs, every job in turn (or one with --job); --follow waits for new lines.

    With --follow the last line is the final status of the run (of the job with --job), and the exit code is
    0 only when that status is `success`, else 5.
    """
    from conveyor.execution.logs import pick_jobs

    client = client_from(ctx)
    jobs = client.get(f"/runs/{run}/jobs")["items"]
    chosen = pick_jobs(jobs, job)
    if not chosen:
        fail(f"run {run} has no job {job!r}" if job else f"run {run} has no jobs", EXIT_NOT_FOUND)
    waits = WaitWatcher(client, run, {entry["id"] for entry in chosen}) if follow else None
    for entry in chosen:
        if len(chosen) > 1:
            typer.echo(f"==> {entry.get('display_name') or entry.get('name')} ({entry.get('status')}) <==")
        _print_job_log(client, run, entry["id"], waits)
    if waits is not None:
        what, status, because = _final_status(client, run, chosen[0]["id"] if job else None, waits)
        line, code = follow_verdict(what, status, because)
        typer.echo(line)
        if code:
            raise typer.Exit(code)


def follow_verdict(what: str, status: str, because: str | None = None) -> tuple[str, int]:
    """The last line of `run logs --follow` and its exit code: 0 only for `success`, else 5.

    A run or job that did not succeed says why in brackets when the server knows (`ended_because`)."""
    if status == "success":
        return f"{what} succeeded", 0
    return f"{what} did not succeed: {status}" + (f" ({because})" if because else ""), EXIT_RUN_NOT_SUCCESSFUL


WAITING = frozenset({"pending", "waiting_approval", "queued"})


def wait_lines(seen: dict[str, str], jobs: list[dict[str, Any]], only: set[str]) -> list[str]:
    """`[job] <why it waits>` for each job of `only` whose waiting reason changed since `seen` (updated).

    The reason of a pending or queued job is the dispatcher's wait note (`waiting: 1 matching agent
    busy`, `unschedulable: …`, a scaler's or a worker's say), so each change is printed once.
    """
    lines: list[str] = []
    for job in jobs:
        note = job.get("reason")
        if job.get("id") not in only or job.get("status") not in WAITING or not note:
            continue
        if seen.get(job["id"]) == note:
            continue
        seen[job["id"]] = note
        lines.append(f"[{job.get('display_name') or job.get('name')}] {note}")
    return lines


class WaitWatcher:
    """Prints the followed jobs' waiting reasons as they change (asked only while no log line comes)."""

    def __init__(self, client: AdminClient, run: str, only: set[str]) -> None:
        self.client, self.run, self.only = client, run, only
        self.seen: dict[str, str] = {}

    def check(self, jobs: list[dict[str, Any]] | None = None) -> None:
        """Print what changed, from `jobs` or from the run's jobs read now."""
        if jobs is None:
            jobs = self.client.get(f"/runs/{self.run}/jobs")["items"]
        for line in wait_lines(self.seen, jobs, self.only):
            typer.echo(line)


def _final_status(
    client: AdminClient, run: str, job_id: str | None, waits: WaitWatcher
) -> tuple[str, str, str | None]:
    """Poll the run (or its job) until it is terminal: ("run #N" or "job NAME", status, why it ended)."""
    from conveyor.model.states import JOB_TERMINAL, RUN_TERMINAL

    while True:
        body = client.get(f"/runs/{run}")
        if job_id is None:
            if body["status"] in RUN_TERMINAL:
                what = f"run #{body.get('number', run)} {body.get('workflow', '')}".rstrip()
                return what, body["status"], body.get("ended_because")
        else:
            entry = next((j for j in body.get("jobs", []) if j.get("id") == job_id), None)
            if entry is not None and entry["status"] in JOB_TERMINAL:
                what = f"job {entry.get('display_name') or entry.get('name')}"
                return what, entry["status"], entry.get("reason") if entry["status"] != "success" else None
        waits.check(body.get("jobs", []))
        time.sleep(LOG_POLL_S)  # the documented way to follow is polling (docs/design/admin.md §7)


def _print_job_log(client: AdminClient, run: str, job_id: str, waits: WaitWatcher | None) -> None:
    """Poll the range route from offset 0, printing each piece; when following (`waits`), until
    `complete`, printing why jobs wait whenever no new line came."""
    offset = 0
    execution = None
    while True:
        body = client.get(f"/runs/{run}/jobs/{job_id}/logs", offset=offset, limit_bytes=LOG_PAGE_BYTES)
        shown = body.get("execution")  # absent from an older server's answer
        if execution is not None and shown is not None and shown != execution and offset > 0:
            # The job ran again and the log shown is the new execution's: its offsets start over.
            sys.stdout.write(f"--- the job ran again (execution {shown}): its log from the start ---\n")
            execution, offset = shown, 0
            continue
        execution = shown
        if body["text"]:
            sys.stdout.write(body["text"])
            sys.stdout.flush()
        moved = body["next_offset"] != offset
        offset = body["next_offset"]
        if body["complete"] or (not moved and waits is None):
            return
        if not moved and waits is not None:
            waits.check()
            # Polling the range route is the documented way to follow (docs/design/admin.md §7).
            time.sleep(LOG_POLL_S)


@app.command("cancel")
def cancel(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN")],
    job: Annotated[str | None, typer.Option("--job", help="Cancel one job only.")] = None,
    reason: Annotated[str | None, typer.Option("--reason")] = None,
    force: Annotated[bool, typer.Option("--force", help="Kill at once, no hooks.")] = False,
    json_output: JsonFlag = False,
) -> None:
    """Cancel a run (or one job): queued jobs at once, running ones through their agents."""
    client = client_from(ctx, json_output)
    path = f"/runs/{run}/jobs/{job}/cancel" if job else f"/runs/{run}/cancel"
    body = {"force": force, **({"reason": reason} if reason else {})}
    answer = client.request("POST", path, json_body=body)
    if client.options.json_output:
        print_json(answer)
    else:
        typer.echo(
            f"cancelled {answer['cancelled']} job(s) at once; signalled {answer['signalled']} running job(s)"
        )


@app.command("rerun")
def rerun(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN")],
    failed_only: Annotated[
        bool, typer.Option("--failed-only", help="Copy the jobs that succeeded; run only the others.")
    ] = False,
    json_output: JsonFlag = False,
) -> None:
    """Start a new run from RUN's event and lock (same commit)."""
    client = client_from(ctx, json_output)
    created = client.request("POST", f"/runs/{run}/rerun", json_body={"failed_only": failed_only})
    if client.options.json_output:
        print_json(created)
    else:
        print_fields(
            {k: created.get(k) for k in ("id", "number", "workflow", "status", "sha", "parent_run_id")}
        )


def _decide(
    ctx: typer.Context, run: str, job: str | None, comment: str | None, verb: str, json_output: bool
) -> None:
    client = client_from(ctx, json_output)
    jobs = client.get(f"/runs/{run}/jobs").get("items", [])
    chosen = waiting_jobs(jobs, job)
    if not chosen:
        what = f"no job {job!r} in run {run}" if job else f"no job of run {run} waits for approval"
        fail(what, EXIT_NOT_FOUND)
    body = {"comment": comment} if comment else {}
    answers = [client.request("POST", f"/runs/{run}/jobs/{j['id']}/{verb}", json_body=body) for j in chosen]
    if client.options.json_output:
        print_json({"items": answers})
        return
    names = {j["id"]: j.get("display_name") or j["id"] for j in chosen}
    for answer in answers:
        done = "approved" if verb == "approve" else "rejected"
        typer.echo(f"{names.get(answer['job_id'], answer['job_id'])}: {done}, now {answer['status']}")


@app.command("approve")
def approve(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN")],
    job: Annotated[
        str | None, typer.Option("--job", help="One job (id or name); default: every waiting job.")
    ] = None,
    comment: Annotated[str | None, typer.Option("--comment", help="Why; kept with the decision.")] = None,
    json_output: JsonFlag = False,
) -> None:
    """Approve jobs waiting for a protected environment: they are queued (after its wait timer)."""
    _decide(ctx, run, job, comment, "approve", json_output)


@app.command("reject")
def reject(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN")],
    job: Annotated[
        str | None, typer.Option("--job", help="One job (id or name); default: every waiting job.")
    ] = None,
    comment: Annotated[
        str | None, typer.Option("--comment", help="Why; it becomes the job's failure reason.")
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Reject jobs waiting for a protected environment: they fail, and their dependants follow `needs`."""
    _decide(ctx, run, job, comment, "reject", json_output)
