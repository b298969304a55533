"""Notifications, the I/O part (docs/design/events.md §10): one `conveyor.notification` event per fired rule,
emitted in the transaction that ends the run, and its delivery by the event router (webhook or email), whose
failures take the event store's retries and DLQ."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiosmtplib
import httpx
from sqlalchemy import or_, select
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.engine import Database
from conveyor.db.tables import notification_rules, runs, sources
from conveyor.events.emit import emit_system
from conveyor.events.models import NOTIFICATION, EmitRequest, EventSettings, NonRetryableEventError
from conveyor.events.notify import (
    APPROVAL_REQUESTED,
    ApprovalWait,
    Rule,
    RunEnd,
    email_message,
    matching_rules,
    parse_smtp_url,
    run_event,
    run_url,
    secret_reference,
    shown_target,
    webhook_body,
)

log = logging.getLogger(__name__)

# A 4xx other than these will not change on a retry: the rule is wrong, the event goes to the DLQ at once.
_RETRYABLE_4XX = frozenset({408, 425, 429})

# An org secret's value by name (None when there is none): what `secret:NAME` credentials resolve through.
SecretLookup = Callable[[str], Awaitable[str | None]]


async def _resolved(name: str, secrets: SecretLookup | None, what: str) -> str:
    """The value of the org secret `name` that `what` refers to; a missing one will not appear on a retry."""
    value = await secrets(name) if secrets is not None else None
    if value is None:
        raise NonRetryableEventError(f"{what} names the org secret {name}, which does not exist")
    return value


def rule_from_row(row: Any) -> Rule:
    """A `notification_rules` row as the matcher sees it."""
    return Rule(
        id=row.id,
        source_id=row.source_id,
        on=frozenset(row.on_events or ()),
        workflow=row.workflow,
        ref_glob=row.ref_glob,
    )


async def _previous_status(conn: AsyncConnection, run: Row[Any]) -> str | None:
    """The status of the newest earlier run of the same source, workflow and ref that succeeded or failed."""
    if run.source_id is None:
        return None
    r = runs.c
    query = (
        select(r.status)
        .where(
            r.source_id == run.source_id,
            r.workflow == run.workflow,
            r.ref == run.ref if run.ref is not None else r.ref.is_(None),
            r.id != run.id,
            r.status.in_(("success", "failed")),
            r.finished_at.is_not(None),
        )
        .order_by(r.finished_at.desc(), r.id.desc())
        .limit(1)
    )
    if run.finished_at is not None:
        query = query.where(r.finished_at <= run.finished_at)
    return (await conn.execute(query)).scalar_one_or_none()


async def _rules_for(conn: AsyncConnection, org_id: str, source_id: str | None) -> list[Rule]:
    """The org's rules for a source (its own and those on every source), oldest first: one indexed query."""
    t = notification_rules.c
    rule_rows = (
        await conn.execute(
            select(notification_rules)
            .where(t.org_id == org_id, or_(t.source_id.is_(None), t.source_id == source_id))
            .order_by(t.created_at, t.id)
        )
    ).all()
    return [rule_from_row(r) for r in rule_rows]


async def _emit_fired(
    conn: AsyncConnection,
    run: Row[Any],
    fired: list[tuple[Rule, str]],
    settings: EventSettings,
    *,
    extra: Mapping[str, Any],
    dedup_prefix: str,
) -> int:
    """One `conveyor.notification` per fired rule (dedup `<dedup_prefix>:<rule_id>`): the run's fields plus
    `extra`. Returns how many were emitted."""
    source_name = None
    if run.source_id is not None:
        source_name = (
            await conn.execute(select(sources.c.name).where(sources.c.id == run.source_id))
        ).scalar_one_or_none()
    emitted = 0
    for rule, told in fired:
        payload = {
            "rule_id": rule.id,
            "event": told,
            "run_id": run.id,
            "run_number": run.number,
            "source": source_name or run.routing_key,
            "routing_key": run.routing_key,
            "repo": run.repo,
            "workflow": run.workflow,
            "ref": run.ref,
            "sha": run.sha,
            "status": run.status,
            "url": run_url(settings.public_url, run.id),
            **extra,
        }
        result = await emit_system(
            conn,
            EmitRequest(
                name=NOTIFICATION,
                origin="system",
                org_id=run.org_id,
                payload=payload,
                source_routing_key=run.routing_key,
                source_repo=run.repo,
                source_run_id=run.id,
                # A notification starts no run: it never counts towards a chain.
                chain_depth=0,
                dedup_key=f"{dedup_prefix}:{rule.id}",
            ),
            settings,
        )
        emitted += result is not None
    return emitted


def _run_end(run: Row[Any]) -> RunEnd:
    return RunEnd(
        run_id=run.id, source_id=run.source_id, workflow=run.workflow, ref=run.ref, status=run.status
    )


async def emit_for_run_end(conn: AsyncConnection, run: Row[Any], settings: EventSettings) -> int:
    """In the transaction that records `run`'s terminal status: one `conveyor.notification` per rule that
    fires (dedup `nt:<run_id>:<rule_id>`). Returns how many were emitted."""
    rules = await _rules_for(conn, run.org_id, run.source_id)
    if not rules:
        return 0
    event = run_event(run.status, await _previous_status(conn, run))
    if event is None:
        return 0
    fired = matching_rules(rules, _run_end(run), event)
    if not fired:
        return 0
    return await _emit_fired(conn, run, fired, settings, extra={}, dedup_prefix=f"nt:{run.id}")


async def emit_for_approval(conn: AsyncConnection, waiting: ApprovalWait, settings: EventSettings) -> int:
    """In the transaction that makes a job wait for an approver (docs/design/approvals.md §5): one
    `conveyor.notification` per rule on `approval_requested` that the run passes (source, workflow, ref),
    dedup `na:<job_id>:<blocked_since>:<rule_id>`, so a job that waits again later is told again."""
    run = (await conn.execute(select(runs).where(runs.c.id == waiting.run_id))).first()
    if run is None:
        return 0
    rules = await _rules_for(conn, run.org_id, run.source_id)
    fired = matching_rules(rules, _run_end(run), APPROVAL_REQUESTED)
    if not fired:
        return 0
    extra = {
        "status": "waiting_approval",
        "job_id": waiting.job_id,
        "job": waiting.job,
        "environment": waiting.environment,
        "approvers": list(waiting.approvers),
    }
    prefix = f"na:{waiting.job_id}:{waiting.since}"
    return await _emit_fired(conn, run, fired, settings, extra=extra, dedup_prefix=prefix)


async def deliver(
    db: Database, payload: Mapping[str, Any], settings: EventSettings, secrets: SecretLookup | None = None
) -> str:
    """Send one notification; the outcome to record (`delivered`, or `no-registration` when its rule was
    removed since). Raises on failure: the router retries, then dead-letters. A `secret:NAME` webhook and
    the SMTP password are read from the secret store (`secrets`) now, never stored elsewhere."""
    async with db.read() as conn:
        row = (
            await conn.execute(
                select(notification_rules).where(notification_rules.c.id == payload["rule_id"])
            )
        ).first()
    if row is None:
        return "no-registration"
    if row.target_kind == "webhook":
        url = row.target
        if (name := secret_reference(url)) is not None:
            url = await _resolved(name, secrets, "the webhook")
            if not url.startswith(("http://", "https://")):
                raise NonRetryableEventError(f"the org secret {name} is not an http(s) URL")
        await send_webhook(url, payload, settings.notify_timeout_seconds)
    else:
        await send_email(row.target, payload, settings, secrets)
    return "delivered"


async def send_webhook(url: str, payload: Mapping[str, Any], timeout_s: float) -> None:
    """POST the JSON body; a 2xx is delivered. Errors name the host only (the URL may be a secret)."""
    shown = shown_target("webhook", url)
    try:
        async with httpx.AsyncClient(timeout=timeout_s, follow_redirects=False) as client:
            answer = await client.post(url, json=webhook_body(payload))
    except httpx.HTTPError as exc:
        raise RuntimeError(f"webhook {shown}: {type(exc).__name__}") from None
    if answer.is_success:
        return
    detail = f"webhook {shown} answered {answer.status_code}"
    if 400 <= answer.status_code < 500 and answer.status_code not in _RETRYABLE_4XX:
        raise NonRetryableEventError(detail)
    raise RuntimeError(detail)


async def send_email(
    recipient: str, payload: Mapping[str, Any], settings: EventSettings, secrets: SecretLookup | None = None
) -> None:
    """One message through `CONVEYOR_SMTP_URL`, from `CONVEYOR_SMTP_FROM`."""
    if not settings.smtp_url or not settings.smtp_from:
        raise NonRetryableEventError(
            "an email rule fired but CONVEYOR_SMTP_URL or CONVEYOR_SMTP_FROM is not set"
        )
    try:
        target = parse_smtp_url(settings.smtp_url)
    except ValueError as exc:
        raise NonRetryableEventError(str(exc)) from None
    password = target.password
    if target.password_secret is not None:
        password = await _resolved(target.password_secret, secrets, "CONVEYOR_SMTP_URL")
    message = email_message(payload, settings.smtp_from, recipient)
    await aiosmtplib.send(
        message,
        hostname=target.host,
        port=target.port,
        use_tls=target.use_tls,
        username=target.username,
        password=password,
        timeout=settings.notify_timeout_seconds,
    )
