"""Admin routes of internal events, the DLQ, registrations and trust grants (docs/design/events.md §7)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from conveyor.admin.pagination import DEFAULT_LIMIT, check_limit
from conveyor.db.tables import DEFAULT_ORG
from conveyor.events import admin_store, store
from conveyor.events.admin_store import REGISTRATION_COLUMNS, NotificationRule
from conveyor.events.cron import next_slot
from conveyor.events.emit import emit_in_tx
from conveyor.events.models import OUTCOMES, STATES, EmitRejected, EmitRequest, EventSettings
from conveyor.events.notify import NOTIFY_EVENTS, shown_target
from conveyor.events.registrations import UnknownRoutingKey, set_disabled
from conveyor.events.registrations import delete_registration as remove_registration
from conveyor.events.registrations import register_manual as register_manual_rows
from conveyor.events.startup import EVENT_PRODUCERS, EVENTS, event_settings
from conveyor.http import Principal, database, log_write, require
from conveyor.http.paging import Page
from conveyor.http.parts import parts_of
from conveyor.ingest import store as ingest_store
from conveyor.ingest.pipeline import ManualRunError
from conveyor.ingest.service import INGEST
from conveyor.lockfile import LockReadError, parse_lock
from conveyor.model.errors import ApiError, conflict, not_found
from conveyor.model.ids import new_id, utc_now
from conveyor.model.redact import redact_event_payload

router = APIRouter()
RowPage = Page[dict[str, Any]]


def _settings(request: Request) -> EventSettings:
    service = parts_of(request).get(EVENTS)
    return service.settings if service is not None else event_settings(request.app.state.server.settings)


def _wake(request: Request) -> None:
    service = parts_of(request).get(EVENTS)
    if service is not None:
        service.wake()


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# --- events


@router.get("/events", operation_id="events.list", response_model=RowPage)
async def list_events(
    request: Request,
    name: str | None = None,
    outcome: str | None = None,
    state: str | None = None,
    internal: bool = True,
    since: datetime | None = None,
    before: datetime | None = None,
    limit: int = Query(DEFAULT_LIMIT),
    cursor: str | None = None,
    principal: Principal = Depends(require("event.read", scoped=True)),
) -> RowPage:
    """Events newest first; a scoped token sees only its routing key's events; `internal=false` leaves
    out Conveyor's own names (`__*`, `conveyor.*`)."""
    if outcome is not None and outcome not in OUTCOMES:
        raise ApiError(400, "invalid_request", f"outcome must be one of {', '.join(OUTCOMES)}")
    if state is not None and state not in STATES:
        raise ApiError(400, "invalid_request", f"state must be one of {', '.join(STATES)}")
    check_limit(limit)
    filters = {
        "name": name,
        "outcome": outcome,
        "state": state,
        "internal": None if internal else False,
        "since": _utc(since),
        "before": _utc(before),
        "routing_key": principal.routing_key,
    }
    async with database(request).read() as conn:
        items, following = await store.page_events(
            conn, filters=filters, limit=limit, cursor=cursor, now=utc_now()
        )
    return RowPage(items=items, next_cursor=following)


async def _event_or_404(request: Request, principal: Principal, event_id: str) -> dict[str, Any]:
    async with database(request).read() as conn:
        row = await store.get_event(conn, event_id)
    if row is None or not principal.may_see(row["source_routing_key"]):
        raise not_found(f"event {event_id}")
    return row


@router.get("/events/{event_id}", operation_id="events.show")
async def show_event(
    event_id: str, request: Request, principal: Principal = Depends(require("event.read", scoped=True))
) -> dict[str, Any]:
    """Metadata, outcome, state and the runs the event dispatched."""
    row = await _event_or_404(request, principal, event_id)
    async with database(request).read() as conn:
        runs = await store.runs_of_event(conn, event_id)
    return {"event": store.list_item(row, utc_now()), "runs": runs}


@router.get("/events/{event_id}/payload", operation_id="events.payload")
async def event_payload(
    event_id: str,
    request: Request,
    principal: Principal = Depends(require("event.read_payload", scoped=True)),
) -> dict[str, Any]:
    """The payload, redacted (claim codes and secret-like keys)."""
    row = await _event_or_404(request, principal, event_id)
    return {"payload": redact_event_payload(row["payload"] or {})}


class EmitBody(BaseModel):
    """Body of `POST /events`."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=255)
    payload: Any = Field(default_factory=dict)
    routing_key: str | None = None
    source_repo: str | None = None
    target_repos: list[str] | None = None


@router.post("/events", status_code=201, operation_id="events.emit")
async def emit_event(
    body: EmitBody,
    request: Request,
    response: Response,
    idempotency_key: str | None = Header(default=None, alias="Idempotency-Key"),
    principal: Principal = Depends(require("event.emit", scoped=True)),
) -> dict[str, Any]:
    """An operator's event: origin `admin`, depth 0, the normal circuit breaker."""
    routing_key = body.routing_key
    routing_key = principal.scope_filter(routing_key, "emit for")
    if body.source_repo is not None and routing_key is None:
        raise ApiError(400, "routing_key_required", "source_repo needs a routing_key")
    settings = _settings(request)
    async with database(request).transaction() as conn:
        org_id = DEFAULT_ORG
        if routing_key is not None:
            source = await admin_store.source_of_routing_key(conn, routing_key)
            if source is None:
                raise not_found(f"source with routing key {routing_key}")
            org_id = source.org_id
        request_ = EmitRequest(
            name=body.name,
            origin="admin",
            org_id=org_id,
            payload=body.payload,
            source_routing_key=routing_key,
            source_repo=body.source_repo,
            target_repos=body.target_repos or None,
            dedup_key=f"admin:{principal.token_id}:{idempotency_key}" if idempotency_key else None,
        )
        try:
            result = await emit_in_tx(conn, request_, settings)
        except EmitRejected as exc:
            headers = {}
            if exc.retry_after_ms is not None:
                headers["Retry-After"] = str(max(1, -(-exc.retry_after_ms // 1000)))
            raise ApiError(exc.status, exc.code, exc.detail, headers=headers) from exc
        status = 201 if result.created else 200
        await log_write(request, conn, target_type="event", target_id=result.event_id, status_code=status)
    response.status_code = status
    _wake(request)
    return {"event_id": result.event_id, "created": result.created}


# --- DLQ


@router.get("/event-dlq", operation_id="event_dlq.list", response_model=RowPage)
async def list_dlq(
    request: Request,
    name: str | None = None,
    reason: str | None = None,
    limit: int = Query(DEFAULT_LIMIT),
    cursor: str | None = None,
    principal: Principal = Depends(require("event_dlq.read", scoped=True)),
) -> RowPage:
    """Dead letters, newest first."""
    check_limit(limit)
    filters = {"name": name, "reason": reason, "routing_key": principal.routing_key}
    async with database(request).read() as conn:
        items, following = await store.page_dlq(
            conn, filters=filters, limit=limit, cursor=cursor, now=utc_now()
        )
    return RowPage(items=items, next_cursor=following)


@router.get("/event-dlq/count", operation_id="event_dlq.count")
async def count_dlq(
    request: Request, principal: Principal = Depends(require("event_dlq.read", scoped=True))
) -> dict[str, int]:
    """How many dead letters."""
    routing_key = principal.scope_filter(None)
    async with database(request).read() as conn:
        return {"count": await store.count_dlq(conn, routing_key=routing_key)}


async def _dlq_or_404(request: Request, principal: Principal, event_id: str) -> dict[str, Any]:
    row = await _event_or_404(request, principal, event_id)
    if row["dlq_at"] is None:
        raise not_found(f"dead letter {event_id}")
    return row


@router.get("/event-dlq/{event_id}", operation_id="event_dlq.show")
async def show_dlq(
    event_id: str, request: Request, principal: Principal = Depends(require("event_dlq.read", scoped=True))
) -> dict[str, Any]:
    """A dead letter as `event show`."""
    row = await _dlq_or_404(request, principal, event_id)
    async with database(request).read() as conn:
        runs = await store.runs_of_event(conn, event_id)
    return {"event": store.list_item(row, utc_now()), "runs": runs}


@router.post("/event-dlq/{event_id}/retry", operation_id="event_dlq.retry")
async def retry_dlq(
    event_id: str, request: Request, principal: Principal = Depends(require("event_dlq.manage", scoped=True))
) -> dict[str, str]:
    """Back to pending with attempts 0 (last_error kept)."""
    await _event_or_404(request, principal, event_id)
    async with database(request).transaction() as conn:
        if not await store.dlq_retry(conn, event_id):
            raise conflict("not_in_dlq", f"event {event_id} is not in the DLQ")
        await log_write(request, conn, target_type="event", target_id=event_id, status_code=200)
    _wake(request)
    return {"event_id": event_id, "state": "pending"}


@router.delete("/event-dlq/{event_id}", status_code=204, operation_id="event_dlq.discard")
async def discard_dlq(
    event_id: str, request: Request, principal: Principal = Depends(require("event_dlq.manage", scoped=True))
) -> Response:
    """Delete a dead letter."""
    await _event_or_404(request, principal, event_id)
    async with database(request).transaction() as conn:
        if not await store.dlq_discard(conn, event_id):
            raise conflict("not_in_dlq", f"event {event_id} is not in the DLQ")
        await log_write(request, conn, target_type="event", target_id=event_id, status_code=204)
    return Response(status_code=204)


# --- registrations


@router.get("/registrations", operation_id="registrations.list", response_model=RowPage)
async def list_registrations(
    request: Request,
    routing_key: str | None = None,
    repo: str | None = None,
    trigger_kind: str | None = None,
    workflow: str | None = None,
    limit: int = Query(DEFAULT_LIMIT),
    cursor: str | None = None,
    principal: Principal = Depends(require("registration.read", scoped=True)),
) -> RowPage:
    """Registrations newest first."""
    routing_key = principal.scope_filter(routing_key, "read")
    filters = {"routing_key": routing_key, "repo": repo, "trigger_kind": trigger_kind, "workflow": workflow}
    async with database(request).read() as conn:
        items, following = await admin_store.page_registrations(
            conn, filters=filters, limit=limit, cursor=cursor
        )
    return RowPage(items=items, next_cursor=following)


async def _registration_or_404(
    request: Request, principal: Principal, registration_id: str
) -> dict[str, Any]:
    async with database(request).read() as conn:
        row = await admin_store.get_registration(conn, registration_id)
    if row is None or not principal.may_see(row["routing_key"]):
        raise not_found(f"registration {registration_id}")
    return row


@router.get("/registrations/{registration_id}", operation_id="registrations.show")
async def show_registration(
    registration_id: str,
    request: Request,
    principal: Principal = Depends(require("registration.read", scoped=True)),
) -> dict[str, Any]:
    """The row, its lock entry and its schedules."""
    row = await _registration_or_404(request, principal, registration_id)
    now = utc_now()
    async with database(request).read() as conn:
        found = await admin_store.schedules_of_registration(conn, registration_id)
    schedules = [
        {
            "cron": schedule.cron,
            "timezone": schedule.timezone,
            "armed_at": schedule.armed_at,
            "last_slot_at": schedule.last_slot_at,
            "next_slot_at": next_slot(schedule.cron, schedule.timezone, now),
        }
        for schedule in found
    ]
    return {**row, "schedules": schedules}


class ManualBody(BaseModel):
    """Body of `POST /registrations/manual`."""

    model_config = ConfigDict(extra="forbid")
    routing_key: str
    repo: str
    lock: dict[str, Any]
    commit_sha: str | None = None
    default_branch: str | None = None
    workflows: list[str] | None = None


@router.post("/registrations/manual", operation_id="registrations.manual")
async def register_manual(
    body: ManualBody,
    request: Request,
    principal: Principal = Depends(require("registration.manage", scoped=True)),
) -> dict[str, Any]:
    """Upsert the lock's registered workflows for (routing key, repo); the repo's other rows stay."""
    principal.check_key(body.routing_key, "manage")
    try:
        lock = parse_lock(json.dumps(body.lock).encode())
    except LockReadError as exc:
        raise ApiError(400, "invalid_lock_file", str(exc)) from exc
    except ValidationError as exc:
        raise ApiError(400, "invalid_lock_file", str(exc)) from exc
    async with database(request).transaction() as conn:
        try:
            result = await register_manual_rows(
                conn,
                routing_key=body.routing_key,
                repo=body.repo,
                lock=lock,
                commit_sha=body.commit_sha,
                default_branch=body.default_branch,
                only=body.workflows,
                settings=_settings(request),
            )
        except UnknownRoutingKey:
            raise not_found(f"source with routing key {body.routing_key}") from None
        await log_write(request, conn, target_type="registration", target_id=body.repo, status_code=200)
    _wake(request)
    service = parts_of(request).get(EVENTS)
    if service is not None:
        service.metrics.registration_syncs.labels("manual", "ok").inc()
    return {"created": result.created, "updated": result.updated, "skipped_global": result.skipped_global}


class RefreshBody(BaseModel):
    """Body of `POST /registrations/refresh`: one routing key, or every git-backed source."""

    model_config = ConfigDict(extra="forbid")
    routing_key: str | None = None


@router.post("/registrations/refresh", operation_id="registrations.refresh")
async def refresh_registrations(
    request: Request,
    body: RefreshBody | None = None,
    principal: Principal = Depends(require("registration.manage", scoped=True)),
) -> dict[str, Any]:
    """Re-sync registrations from each source's default branch, as a push there would (prune=True)."""
    routing_key = (body or RefreshBody()).routing_key
    routing_key = principal.scope_filter(routing_key, "manage")
    ingest, producers = parts_of(request).get(INGEST), parts_of(request).get(EVENT_PRODUCERS)
    if ingest is None or producers is None:
        raise ApiError(503, "unavailable", "ingest is not running on this node")
    async with database(request).read() as conn:
        ids = await admin_store.git_backed_source_ids(conn, routing_key)
        found = [await ingest_store.get_source(conn, source_id) for source_id in ids]
    if routing_key is not None and not found:
        raise not_found(f"source with routing key {routing_key}")
    refreshed: list[dict[str, Any]] = []
    locks: list[tuple[Any, str, Any]] = []
    for source in found:
        if source is None:
            continue
        try:  # read outside any transaction: a lock may come from a forge or a fetch
            sha, lock = await ingest.pipeline.default_branch_lock(source)
        except ManualRunError as exc:
            refreshed.append({"routing_key": source.routing_key, "error": exc.code, "detail": str(exc)})
            continue
        locks.append((source, sha, lock))
        refreshed.append({"routing_key": source.routing_key, "commit_sha": sha})
    if locks:
        # One transaction and one access-log row for the request (a row per source reused the entry's id
        # and failed the second source's commit with a 503 after the first one had committed).
        async with database(request).transaction() as conn:
            for source, sha, lock in locks:
                await producers.sync_push(conn, source, sha, lock)
            target = locks[0][0].id if len(locks) == 1 else routing_key
            await log_write(request, conn, target_type="source", target_id=target, status_code=200)
    _wake(request)
    return {"items": refreshed}


class PatchBody(BaseModel):
    """Body of `PATCH /registrations/{id}`."""

    model_config = ConfigDict(extra="forbid")
    disabled: bool


@router.patch("/registrations/{registration_id}", operation_id="registrations.update")
async def patch_registration(
    registration_id: str,
    body: PatchBody,
    request: Request,
    principal: Principal = Depends(require("registration.manage", scoped=True)),
) -> dict[str, Any]:
    """Enable or disable (enabling re-arms schedules)."""
    await _registration_or_404(request, principal, registration_id)
    async with database(request).transaction() as conn:
        await set_disabled(conn, registration_id, body.disabled)
        await log_write(request, conn, target_type="registration", target_id=registration_id, status_code=200)
    row = await _registration_or_404(request, principal, registration_id)
    return {k: row[k] for k in REGISTRATION_COLUMNS}


@router.delete("/registrations/{registration_id}", status_code=204, operation_id="registrations.delete")
async def delete_registration(
    registration_id: str,
    request: Request,
    principal: Principal = Depends(require("registration.manage", scoped=True)),
) -> Response:
    """Remove one registration; the next push re-creates it if the workflow still exists."""
    await _registration_or_404(request, principal, registration_id)
    async with database(request).transaction() as conn:
        await remove_registration(conn, registration_id, _settings(request))
        await log_write(request, conn, target_type="registration", target_id=registration_id, status_code=204)
    _wake(request)
    return Response(status_code=204)


# --- trust grants


class TrustBody(BaseModel):
    """Body of `POST /event-trust`."""

    model_config = ConfigDict(extra="forbid")
    source_routing_key: str
    source_repo: str = "*"
    target_routing_key: str
    target_repo: str = "*"
    event_names: list[str] = Field(min_length=1)


@router.get("/event-trust", operation_id="event_trust.list", response_model=RowPage)
async def list_trust(
    request: Request, principal: Principal = Depends(require("registration.read", scoped=True))
) -> RowPage:
    """Every grant (a scoped token: those whose target is its scope)."""
    target = principal.scope_filter(None)
    async with database(request).read() as conn:
        return RowPage(items=await admin_store.list_trust(conn, target_routing_key=target), next_cursor=None)


@router.post("/event-trust", status_code=201, operation_id="event_trust.create")
async def create_trust(
    body: TrustBody,
    request: Request,
    principal: Principal = Depends(require("registration.manage", scoped=True)),
) -> dict[str, Any]:
    """The target consents: a scoped token may grant only into its own routing key."""
    principal.check_key(body.target_routing_key, "grant into")
    row = {
        "id": new_id(),
        "org_id": DEFAULT_ORG,
        **body.model_dump(),
        "enabled": True,
        "created_at": utc_now(),
        "created_by": principal.token_id,
    }
    async with database(request).transaction() as conn:
        target = await admin_store.source_of_routing_key(conn, body.target_routing_key)
        if target is None:
            raise not_found(f"source with routing key {body.target_routing_key}")
        row["org_id"] = target.org_id
        if not await admin_store.insert_trust(conn, row):
            raise conflict("conflict", "an identical grant exists")
        await log_write(request, conn, target_type="event_trust", target_id=row["id"], status_code=201)
    return row


@router.delete("/event-trust/{grant_id}", status_code=204, operation_id="event_trust.delete")
async def delete_trust(
    grant_id: str,
    request: Request,
    principal: Principal = Depends(require("registration.manage", scoped=True)),
) -> Response:
    """Remove a grant."""
    async with database(request).transaction() as conn:
        found = await admin_store.get_trust(conn, grant_id)
        if found is None or not principal.may_see(found["target_routing_key"]):
            raise not_found(f"grant {grant_id}")
        await admin_store.delete_trust(conn, grant_id)
        await log_write(request, conn, target_type="event_trust", target_id=grant_id, status_code=204)
    return Response(status_code=204)


# --- notification rules (docs/design/events.md §10)


class NotificationRuleBody(BaseModel):
    """Body of `POST /notification-rules`: exactly one of `email` and `webhook`."""

    model_config = ConfigDict(extra="forbid")
    source: str | None = Field(default=None, max_length=255)  # id, name or routing key; none: every source
    on: list[Literal["failed", "fixed", "succeeded", "approval_requested"]] = Field(min_length=1)
    workflow: str | None = Field(default=None, min_length=1, max_length=200)
    ref: str | None = Field(default=None, min_length=1, max_length=500)  # a branch glob: `main`, `release/*`
    email: str | None = Field(default=None, pattern=r"^[^@\s]+@[^@\s]+$", max_length=320)
    # A URL, or `secret:NAME`: the org secret holding it, read at each delivery (a webhook URL is often a secret).
    webhook: str | None = Field(
        default=None, pattern=r"^(https?://[^\s]+|secret:[A-Za-z_][A-Za-z0-9_]{0,127})$", max_length=2000
    )


def _rule_item(row: NotificationRule, source_name: str | None) -> dict[str, Any]:
    return {
        "id": row.id,
        "source_id": row.source_id,
        "source": source_name,
        "on": [e for e in NOTIFY_EVENTS if e in (row.on_events or ())],
        "workflow": row.workflow,
        "ref": row.ref_glob,
        "target_kind": row.target_kind,
        "target": shown_target(row.target_kind, row.target),
        "created_at": row.created_at,
        "created_by": row.created_by,
    }


@router.get("/notification-rules", operation_id="notification_rules.list", response_model=RowPage)
async def list_notification_rules(
    request: Request, _: Principal = Depends(require("source.read"))
) -> RowPage:
    """Every rule, oldest first; a webhook's URL shows its host only (the URL is often its own secret)."""
    async with database(request).read() as conn:
        rules = await admin_store.list_notification_rules(conn)
    return RowPage(items=[_rule_item(rule, source_name) for rule, source_name in rules], next_cursor=None)


@router.post("/notification-rules", status_code=201, operation_id="notification_rules.create")
async def create_notification_rule(
    body: NotificationRuleBody,
    request: Request,
    principal: Principal = Depends(require("source.manage")),
) -> dict[str, Any]:
    """A rule: tell an email address or a webhook when runs of a source (or of every source) end."""
    if (body.email is None) == (body.webhook is None):
        raise ApiError(422, "invalid_body", "email, webhook: give exactly one of them")
    row: dict[str, Any] = {
        "id": new_id(),
        "org_id": DEFAULT_ORG,
        "source_id": None,
        "on_events": [e for e in NOTIFY_EVENTS if e in body.on],
        "workflow": body.workflow,
        "ref_glob": body.ref,
        "target_kind": "email" if body.email is not None else "webhook",
        "target": body.email if body.email is not None else body.webhook,
        "created_at": utc_now(),
        "created_by": principal.token_id,
    }
    source_name = None
    async with database(request).transaction() as conn:
        if body.source is not None:
            source = await ingest_store.find_source(conn, body.source)
            if source is None:
                raise not_found(f"source {body.source}")
            row["source_id"], row["org_id"], source_name = source.id, source.org_id, source.name
        rule = NotificationRule(**row)
        await admin_store.insert_notification_rule(conn, rule)
        await log_write(request, conn, target_type="notification_rule", target_id=rule.id, status_code=201)
    return _rule_item(rule, source_name)


@router.delete("/notification-rules/{rule_id}", status_code=204, operation_id="notification_rules.delete")
async def delete_notification_rule(
    rule_id: str, request: Request, _: Principal = Depends(require("source.manage"))
) -> Response:
    """Remove a rule; its notifications not yet delivered are dropped (recorded `no-registration`)."""
    async with database(request).transaction() as conn:
        if not await admin_store.delete_notification_rule(conn, rule_id):
            raise not_found(f"notification rule {rule_id}")
        await log_write(request, conn, target_type="notification_rule", target_id=rule_id, status_code=204)
    return Response(status_code=204)
