"""Notifications, the pure part (docs/design/events.md §10): which rules a run's end fires, whether it is a
fix, and what the webhook body and the email say. The SQL and the senders are in `notify_delivery.py`."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from conveyor.matching.patterns import compiled_filter

NOTIFY_EVENTS = ("failed", "fixed", "succeeded", "approval_requested")
# A job started waiting for an approver (docs/design/approvals.md §5): told to rules on it, never a run's end.
APPROVAL_REQUESTED = "approval_requested"


@dataclass(frozen=True)
class Rule:
    """One row of `notification_rules`."""

    id: str
    source_id: str | None
    on: frozenset[str]
    workflow: str | None
    ref_glob: str | None


@dataclass(frozen=True)
class RunEnd:
    """What a rule is matched against: a run that just became terminal."""

    run_id: str
    source_id: str | None
    workflow: str
    ref: str | None
    status: str


@dataclass(frozen=True)
class ApprovalWait:
    """A job that just started waiting for an approver: what an `approval_requested` notification names."""

    run_id: str
    job_id: str
    job: str  # its display name
    environment: str | None
    approvers: tuple[str, ...]
    since: str  # when it started waiting (ISO), which tells one wait from a later one


def run_event(status: str, previous_status: str | None) -> str | None:
    """The notification event of a run's end: `fixed` is the first success after a failure of the same
    source, workflow and ref (`previous_status`: that of the newest earlier success-or-failure, None if
    none); a cancelled run tells nobody."""
    if status == "failed":
        return "failed"
    if status == "success":
        return "fixed" if previous_status == "failed" else "succeeded"
    return None


def delivered_event(on: Iterable[str], event: str) -> str | None:
    """The event a rule subscribed to `on` is told of, or None. A fix is a success too: a rule on
    `succeeded` alone is told `succeeded`, one on `fixed` is told `fixed`."""
    subscribed = set(on)
    if event in subscribed:
        return event
    if event == "fixed" and "succeeded" in subscribed:
        return "succeeded"
    return None


def _short_ref(ref: str) -> str:
    for prefix in ("refs/heads/", "refs/tags/"):
        if ref.startswith(prefix):
            return ref.removeprefix(prefix)
    return ref


def ref_matches(ref_glob: str, ref: str | None) -> bool:
    """The trigger filters' glob (`*` within a `/` segment, `**` across) against the branch or tag name, or
    the full ref: `main`, `release/*` and `refs/heads/main` all work."""
    if ref is None:
        return False
    matcher = compiled_filter("glob", ref_glob, "")
    return bool(matcher(_short_ref(ref)) or matcher(ref))


def matching_rules(rules: Iterable[Rule], end: RunEnd, event: str) -> list[tuple[Rule, str]]:
    """Each rule that fires for this run end, with the event it is told of, in the given order."""
    fired: list[tuple[Rule, str]] = []
    for rule in rules:
        if rule.source_id is not None and rule.source_id != end.source_id:
            continue
        if rule.workflow is not None and rule.workflow != end.workflow:
            continue
        if rule.ref_glob is not None and not ref_matches(rule.ref_glob, end.ref):
            continue
        told = delivered_event(rule.on, event)
        if told is not None:
            fired.append((rule, told))
    return fired


def run_url(public_url: str | None, run_id: str) -> str | None:
    """The run's dashboard page, when `CONVEYOR_PUBLIC_URL` says where the dashboard is."""
    if not public_url:
        return None
    return f"{public_url.rstrip('/')}/ui/runs/{run_id}"


_VERB = {"failed": "failed", "fixed": "is fixed", "succeeded": "succeeded"}


def _approval_what(payload: Mapping[str, Any]) -> str:
    environment = payload.get("environment")
    wants = f"approval for environment {environment}" if environment else "approval"
    return f"workflow {payload.get('workflow')}: job {payload.get('job')} waits for {wants}"


def summary(payload: Mapping[str, Any]) -> str:
    """One line: `app: workflow ci failed on main (abc1234), run #7`, or for an approval request
    `app: workflow ship: job deploy waits for approval for environment production on main (abc1234), run #7`."""
    ref = _short_ref(str(payload.get("ref") or "")) or "?"
    sha = str(payload.get("sha") or "")[:7]
    number = payload.get("run_number")
    if payload["event"] == APPROVAL_REQUESTED:
        what = _approval_what(payload)
    else:
        what = f"workflow {payload.get('workflow')} {_VERB[payload['event']]}"
    line = f"{payload.get('source')}: {what} on {ref}"
    if sha:
        line += f" ({sha})"
    if number is not None:
        line += f", run #{number}"
    return line


def webhook_body(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON a webhook receives; `text` makes it a valid Slack (and Mattermost) incoming-webhook message."""
    url = payload.get("url")
    text = summary(payload) + (f"\n{url}" if url else "")
    return {
        "event": payload["event"],
        "run_id": payload["run_id"],
        "run_number": payload.get("run_number"),
        "source": payload.get("source"),
        "repo": payload.get("repo"),
        "workflow": payload.get("workflow"),
        "ref": payload.get("ref"),
        "sha": payload.get("sha"),
        "status": payload.get("status"),
        "url": url,
        "text": text,
        **_approval_fields(payload),
    }


def _approval_fields(payload: Mapping[str, Any]) -> dict[str, Any]:
    """What an approval request adds: the waiting job, its environment and who may approve."""
    if payload["event"] != APPROVAL_REQUESTED:
        return {}
    return {
        "job_id": payload.get("job_id"),
        "job": payload.get("job"),
        "environment": payload.get("environment"),
        "approvers": payload.get("approvers") or [],
    }


def email_message(payload: Mapping[str, Any], sender: str, recipient: str) -> EmailMessage:
    """The email: the subject names the workflow and what happened, the body adds the run's link."""
    message = EmailMessage()
    message["From"] = sender
    message["To"] = recipient
    message["Subject"] = f"[Conveyor] {summary(payload)}"
    lines = [
        summary(payload),
        "",
        f"Source:   {payload.get('source')} ({payload.get('repo')})",
        f"Workflow: {payload.get('workflow')}",
        f"Ref:      {payload.get('ref')}",
        f"Commit:   {payload.get('sha')}",
        f"Status:   {payload.get('status')}",
    ]
    if payload["event"] == APPROVAL_REQUESTED:
        lines += [
            f"Job:      {payload.get('job')}",
            f"Environment: {payload.get('environment') or '-'}",
            f"Approvers: {', '.join(payload.get('approvers') or []) or '-'}",
        ]
    lines.append(f"Run:      {payload.get('url') or payload['run_id']}")
    message.set_content("\n".join(lines) + "\n")
    return message


_SECRET_REFERENCE = re.compile(r"secret:([A-Za-z_][A-Za-z0-9_]{0,127})")


def secret_reference(target: str | None) -> str | None:
    """The org secret a credential names instead of holding it (`secret:SLACK_WEBHOOK` → `SLACK_WEBHOOK`),
    or None for a plain value."""
    found = _SECRET_REFERENCE.fullmatch(target or "")
    return found.group(1) if found else None


@dataclass(frozen=True)
class SmtpTarget:
    """Where email goes: `CONVEYOR_SMTP_URL` parsed."""

    host: str
    port: int
    use_tls: bool
    username: str | None
    password: str | None
    password_secret: str | None = None  # the org secret holding the password, read at each delivery


def parse_smtp_url(url: str) -> SmtpTarget:
    """`smtp://[user:password@]host[:port]` (STARTTLS when the server offers it, port 25 by default) or
    `smtps://…` (TLS from the first byte, port 465); `?password=secret:NAME` takes the password from the
    org secret NAME instead of the URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
        raise ValueError(f"CONVEYOR_SMTP_URL must be smtp://host:port or smtps://host:port, not {url!r}")
    use_tls = parts.scheme == "smtps"
    query = parse_qs(parts.query)
    named = query.get("password", [None])[-1]
    password_secret = secret_reference(named)
    if named is not None and password_secret is None:
        raise ValueError("CONVEYOR_SMTP_URL's ?password= names a secret: ?password=secret:NAME")
    if password_secret is not None and parts.password:
        raise ValueError("CONVEYOR_SMTP_URL has a password and ?password=secret:NAME: give one of them")
    return SmtpTarget(
        host=parts.hostname,
        port=parts.port or (465 if use_tls else 25),
        use_tls=use_tls,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        password_secret=password_secret,
    )


def shown_target(kind: str, target: str) -> str:
    """A rule's target as lists show it: a webhook URL often is its own secret (Slack's are), so only its
    scheme and host are shown."""
    if kind != "webhook" or secret_reference(target) is not None:
        return target
    parts = urlsplit(target)
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}/…"
