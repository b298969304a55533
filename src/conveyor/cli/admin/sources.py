"""`conveyor admin source …` (docs/design/admin.md §7, docs/design/execution.md §1)."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer

from conveyor.cli.admin.client import (
    EXIT_RUN_NOT_SUCCESSFUL,
    EXIT_USAGE,
    AdminClient,
    JsonFlag,
    client_from,
    fail,
    print_fields,
    print_json,
    print_table,
)
from conveyor.cli.confirm import confirm_destructive

app = typer.Typer(
    rich_markup_mode=None,
    name="source",
    help="Where events come from: github, git, local, generic.",
    no_args_is_help=True,
)
NULL_SHA = "0" * 40


def _show(client: Any, body: dict[str, Any]) -> None:
    if client.options.json_output:
        print_json(body)
    else:
        print_fields(
            {
                k: body.get(k)
                for k in (
                    "id",
                    "name",
                    "kind",
                    "routing_key",
                    "repo",
                    "public_badges",
                    "fork_pull_requests",
                    "webhook_url",
                )
                if k in body
            }
        )


# docs/design/approvals.md: what a pull request from a fork gets (the API's default is `hold`).
ForkPullRequestsOption = Annotated[
    str | None,
    typer.Option(
        "--fork-pull-requests",
        help="What a pull request from a fork gets: hold (until approved), run-without-secrets or refuse.",
    ),
]


@app.command("add")
def add(
    ctx: typer.Context,
    kind: Annotated[str, typer.Option("--type", help="github, git, local or generic.")],
    name: Annotated[str, typer.Option("--name")],
    path: Annotated[Path | None, typer.Option("--path", help="local: the repository path.")] = None,
    repo: Annotated[str | None, typer.Option("--repo", help="github: OWNER/NAME or OWNER/*.")] = None,
    clone_url: Annotated[str | None, typer.Option("--clone-url")] = None,
    api_url: Annotated[str | None, typer.Option("--api-url", help="github: API base URL.")] = None,
    default_branch: Annotated[str | None, typer.Option("--default-branch")] = None,
    webhook_secret_file: Annotated[Path | None, typer.Option("--webhook-secret-file")] = None,
    verify: Annotated[str | None, typer.Option("--verify", help="git/generic: hmac, token or none.")] = None,
    signature_header: Annotated[str | None, typer.Option("--signature-header")] = None,
    event_header: Annotated[str | None, typer.Option("--event-header")] = None,
    report: Annotated[str | None, typer.Option("--report", help="statuses, checks or none.")] = None,
    fork_pull_requests: ForkPullRequestsOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Add a source (secrets are read from files, never from arguments)."""
    secret = None
    if webhook_secret_file is not None:
        try:
            secret = webhook_secret_file.read_text().strip()
        except OSError as exc:
            fail(f"cannot read {webhook_secret_file}: {exc}", EXIT_USAGE)
    body = {
        "kind": kind,
        "name": name,
        "path": str(path.resolve()) if path else None,
        "repo": repo,
        "clone_url": clone_url,
        "api_url": api_url,
        "default_branch": default_branch,
        "webhook_secret": secret,
        "verify": verify,
        "signature_header": signature_header,
        "event_header": event_header,
        "report": report,
        "fork_pull_requests": fork_pull_requests,
    }
    client = client_from(ctx, json_output)
    _show(
        client, client.request("POST", "/sources", json_body={k: v for k, v in body.items() if v is not None})
    )


@app.command("list")
def list_sources(ctx: typer.Context, json_output: JsonFlag = False) -> None:
    """Every source."""
    client = client_from(ctx, json_output)
    page = client.get("/sources")
    if client.options.json_output:
        print_json(page)
    else:
        print_table(page["items"], ["id", "name", "kind", "routing_key", "repo", "enabled", "public_badges"])


@app.command("show")
def show(
    ctx: typer.Context, source: Annotated[str, typer.Argument(metavar="ID")], json_output: JsonFlag = False
) -> None:
    """One source (by id, name or routing key)."""
    client = client_from(ctx, json_output)
    body = client.get(f"/sources/{source}")
    if client.options.json_output:
        print_json(body)
    else:
        print_fields(body)


@app.command("update")
def update(
    ctx: typer.Context,
    source: Annotated[str, typer.Argument(metavar="ID")],
    enabled: Annotated[bool | None, typer.Option("--enabled/--disabled")] = None,
    default_branch: Annotated[str | None, typer.Option("--default-branch")] = None,
    public_badges: Annotated[
        bool | None,
        typer.Option(
            "--public-badges/--no-public-badges",
            help="Let anyone read this source's status badges (GET /badge/SOURCE/WORKFLOW.svg).",
        ),
    ] = None,
    fork_pull_requests: ForkPullRequestsOption = None,
    webhook_secret_file: Annotated[Path | None, typer.Option("--webhook-secret-file")] = None,
    next_webhook_secret_file: Annotated[Path | None, typer.Option("--next-webhook-secret-file")] = None,
    json_output: JsonFlag = False,
) -> None:
    """Change a source."""
    body: dict[str, Any] = {
        "enabled": enabled,
        "default_branch": default_branch,
        "public_badges": public_badges,
        "fork_pull_requests": fork_pull_requests,
    }
    for key, file in (
        ("webhook_secret", webhook_secret_file),
        ("webhook_secret_next", next_webhook_secret_file),
    ):
        if file is not None:
            body[key] = file.read_text().strip()
    client = client_from(ctx, json_output)
    _show(
        client,
        client.request(
            "PATCH", f"/sources/{source}", json_body={k: v for k, v in body.items() if v is not None}
        ),
    )


@app.command("rm")
def remove(
    ctx: typer.Context,
    source: Annotated[str, typer.Argument(metavar="ID")],
    yes: Annotated[bool, typer.Option("--yes")] = False,
) -> None:
    """Remove a source and its secrets."""
    confirm_destructive(f"remove source {source}?", yes)
    client_from(ctx).request("DELETE", f"/sources/{source}")
    typer.echo(f"removed {source}")


@app.command("webhook-secret")
def webhook_secret(ctx: typer.Context, source: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Print the webhook secret to configure in the forge."""
    body = client_from(ctx).get(f"/sources/{source}/webhook-secret")
    typer.echo(body.get("webhook_secret") or "")


def _git(repo: Path, *args: str) -> str:
    result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if result.returncode != 0:
        fail(f"git {' '.join(args)} failed in {repo}: {result.stderr.strip()}", EXIT_USAGE)
    return result.stdout.strip()


@app.command("trigger-local")
def trigger_local(
    ctx: typer.Context,
    source: Annotated[str, typer.Argument(metavar="SOURCE")],
    repo: Annotated[Path, typer.Option("--repo", help="Repository to read defaults from.")] = Path("."),
    ref: Annotated[str | None, typer.Option("--ref", help="Default: HEAD's symbolic ref.")] = None,
    sha: Annotated[str | None, typer.Option("--sha", help="Default: the ref's commit.")] = None,
    before: Annotated[
        str | None,
        typer.Option(
            "--before",
            help="The commit the ref moved from (all zeros: a new ref). Default: the ref's commit when it "
            "is not --sha yet, else --sha's parent.",
        ),
    ] = None,
    no_wait: Annotated[
        bool, typer.Option("--no-wait", help="Return once the delivery is accepted, without waiting.")
    ] = False,
    wait_timeout: Annotated[
        float, typer.Option("--wait-timeout", help="Seconds to wait for the delivery to be processed.")
    ] = 10.0,
    json_output: JsonFlag = False,
) -> None:
    """Tell the orchestrator a `local` source's ref moved (what the post-receive hook calls).

    Then wait (up to --wait-timeout) for the delivery to be processed and print the runs it started, or
    why it started none; exit 5 when it started none.
    """
    from conveyor.cli.authoring_git import commit_sha
    from conveyor.matching import previous_tip

    ref = ref or _git(repo, "symbolic-ref", "HEAD")
    sha = sha or _git(repo, "rev-parse", "--verify", "--end-of-options", ref)
    if before is None:
        # What preview and run local take as `before` too, so the three compute the same changed files.
        tip = commit_sha(repo, ref)
        before = previous_tip(ref_tip=tip, sha=sha, parent=commit_sha(repo, f"{sha}~1")) or NULL_SHA
    # One delivery id per invocation, reused if the request is retried, so a retry dedups.
    body = {"ref": ref, "sha": sha, "before": before, "delivery_id": str(uuid.uuid4())}
    client = client_from(ctx, json_output)
    answer = client.request("POST", f"/sources/{source}/trigger", json_body=body)
    if no_wait or answer.get("status") != "accepted":
        if client.options.json_output:
            print_json(answer)
        else:
            typer.echo(f"{answer['status']}: delivery {answer['delivery']} for {ref} at {sha[:12]}")
        return
    if not client.options.json_output:
        typer.echo(f"{answer['status']}: delivery {answer['delivery']} for {ref} at {sha[:12]}")
    _report_delivery(client, answer["delivery"], wait_timeout)


WAIT_POLL_S = 0.2


def _report_delivery(client: AdminClient, delivery: str, timeout_s: float) -> None:
    """Poll the delivery until it is processed (or `timeout_s`); print its runs or no-match reason."""
    from conveyor.cli.admin.outcome import delivery_pending, delivery_report

    deadline = time.monotonic() + max(0.0, timeout_s)
    body = client.get(f"/deliveries/{delivery}")
    while delivery_pending(body) and time.monotonic() < deadline:
        time.sleep(WAIT_POLL_S)  # the delivery route is the documented way to watch a delivery
        body = client.get(f"/deliveries/{delivery}")
    if client.options.json_output:
        print_json(body)
    if delivery_pending(body):
        if not client.options.json_output:
            typer.echo(f"not processed after {timeout_s:g} s; see `conveyor admin delivery show {delivery}`")
        return
    lines, started = delivery_report(body)
    if not client.options.json_output:
        for line in lines:
            typer.echo(line)
    if not started:
        raise typer.Exit(EXIT_RUN_NOT_SUCCESSFUL)


@app.command("install-hook")
def install_hook_command(
    source: Annotated[str, typer.Argument(metavar="SOURCE")],
    repo: Annotated[Path, typer.Option("--repo", help="Repository (work tree or bare).")] = Path("."),
    on: Annotated[
        str,
        typer.Option(
            "--on", help="push (default): a post-receive hook; commit: a post-commit hook triggering HEAD."
        ),
    ] = "push",
    force: Annotated[bool, typer.Option("--force", help="Replace a hook Conveyor did not write.")] = False,
) -> None:
    """Write a hook that triggers runs on every push into (or, --on commit, every commit in) a repository."""
    from conveyor.ingest.hook import HookExists, install_hook

    if on not in ("push", "commit"):
        fail(f"--on must be push or commit, got {on!r}", EXIT_USAGE)
    try:
        path = install_hook(repo.resolve(), source, force=force, on="push" if on == "push" else "commit")
    except HookExists as exc:
        fail(str(exc), EXIT_USAGE)
    typer.echo(f"installed {path}")
    if on == "push" and (repo / ".git").is_dir():
        typer.echo(
            "note: git refuses a push into a non-bare repository's checked-out branch; run "
            "`git config receive.denyCurrentBranch updateInstead` in it, or use --on commit",
            err=True,
        )
