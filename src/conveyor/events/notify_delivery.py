"""Notifications, the I/O part (docs/design/events.md §10): one `conveyor.notification` event per fired rule,
emitted in the transaction that ends the run, and its delivery by the event router (webhook or email), whose
failures take the event store's retries and DLQ."""

from __future__ import annotations

import logging
from collections.abc import Mapping
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
    Rule,
    RunEnd,
    email_message,
    matching_rules,
    parse_smtp_url,
    run_event,
    run_url,
    shown_target,
    webhook_body,
)

log = logging.getLogger(__name__)

# A 4xx other than these will not change on a retry: the rule is wrong, the event goes to the DLQ at once.
_RETRYABLE_4XX = frozenset({408, 425, 429})


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


async def emit_for_run_end(conn: AsyncConnection, run: Row[Any], settings: EventSettings) -> int:
    """In the transaction that records `run`'s terminal status: one `conveyor.notification` per rule that
    fires (dedup `nt:<run_id>:<rule_id>`). Returns how many were emitted."""
    t = notification_rules.c
    rule_rows = (
        await conn.execute(
            select(notification_rules)
            .where(t.org_id == run.org_id, or_(t.source_id.is_(None), t.source_id == run.source_id))
            .order_by(t.created_at, t.id)
        )
    ).all()
    if not rule_rows:
        return 0
    event = run_event(run.status, await _previous_status(conn, run))
    if event is None:
        return 0
    end = RunEnd(
        run_id=run.id, source_id=run.source_id, workflow=run.workflow, ref=run.ref, status=run.status
    )
    fired = matching_rules([rule_from_row(r) for r in rule_rows], end, event)
    if not fired:
        return 0
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
                dedup_key=f"nt:{run.id}:{rule.id}",
            ),
            settings,
        )
        emitted += result is not None
    return emitted


async def deliver(db: Database, payload: Mapping[str, Any], settings: EventSettings) -> str:
    """Send one notification; the outcome to record (`delivered`, or `no-registration` when its rule was
    removed since). Raises on failure: the router retries, then dead-letters."""
    async with db.read() as conn:
        row = (
            await conn.execute(
                select(notification_rules).where(notification_rules.c.id == payload["rule_id"])
            )
        ).first()
    if row is None:
        return "no-registration"
    if row.target_kind == "webhook":
        await send_webhook(row.target, payload, settings.notify_timeout_seconds)
    else:
        await send_email(row.target, payload, settings)
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


async def send_email(recipient: str, payload: Mapping[str, Any], settings: EventSettings) -> None:
    """One message through `CONVEYOR_SMTP_URL`, from `CONVEYOR_SMTP_FROM`."""
    if not settings.smtp_url or not settings.smtp_from:
        raise NonRetryableEventError(
            "an email rule fired but CONVEYOR_SMTP_URL or CONVEYOR_SMTP_FROM is not set"
        )
    try:
        target = parse_smtp_url(settings.smtp_url)
    except ValueError as exc:
        raise NonRetryableEventError(str(exc)) from None
    message = email_message(payload, settings.smtp_from, recipient)
    await aiosmtplib.send(
        message,
        hostname=target.host,
        port=target.port,
        use_tls=target.use_tls,
        username=target.username,
        password=target.password,
        timeout=settings.notify_timeout_seconds,
    )
