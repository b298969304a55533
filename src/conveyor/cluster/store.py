"""All SQL of the cluster package: join tokens, peer credentials (docs/design/cluster.md §2.2), job rerouting
(docs/design/cluster.md §4).

Time is the database clock, read once per transaction with `database_now` and bound into every
statement (as `runtime.store` does), so SQLite and PostgreSQL run the same statements.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.tables import dispatch_queue, jobs, join_tokens, peer_credentials
from conveyor.execution.history import record_dispatch_ended
from conveyor.model.ids import new_id
from conveyor.runtime.store import database_now

# Re-exported so the cluster package reads its clock from its own store module.
__all__ = ["database_now"]


@dataclass(frozen=True)
class ConsumedToken:
    """A join token this request may use: its id and the role its credential gets."""

    id: str
    role: Any


@dataclass(frozen=True)
class CredentialRow:
    """A `peer_credentials` row."""

    id: str
    instance_id: str
    role: Any
    stored_key: bytes
    server_key: bytes
    created_at: datetime
    expires_at: datetime
    rotated_at: datetime | None
    revoked_at: datetime | None
    last_seen_at: datetime | None
    last_validated_by: str | None


def _credential(row: Any) -> CredentialRow:
    m = row._mapping
    return CredentialRow(
        id=m["id"],
        instance_id=m["instance_id"],
        role=m["role"],
        stored_key=bytes(m["stored_key"]),
        server_key=bytes(m["server_key"]),
        created_at=m["created_at"],
        expires_at=m["expires_at"],
        rotated_at=m["rotated_at"],
        revoked_at=m["revoked_at"],
        last_seen_at=m["last_seen_at"],
        last_validated_by=m["last_validated_by"],
    )


async def insert_join_token(
    conn: AsyncConnection, *, token_hash: str, role: str, created_by: str, now: datetime, expires_at: datetime
) -> str:
    """Store a new join token's hash; its id."""
    token_id = new_id()
    await conn.execute(
        insert(join_tokens).values(
            id=token_id,
            token_hash=token_hash,
            role=role,
            created_by=created_by,
            created_at=now,
            expires_at=expires_at,
        )
    )
    return token_id


async def consume_join_token(
    conn: AsyncConnection, token_hash: str, instance_id: str, now: datetime
) -> ConsumedToken | None:
    """Consume a fresh token in one atomic statement (safe across coordinators); None if it is not fresh."""
    t = join_tokens.c
    row = (
        await conn.execute(
            update(join_tokens)
            .where(
                and_(
                    t.token_hash == token_hash,
                    t.consumed_at.is_(None),
                    t.revoked_at.is_(None),
                    t.expires_at > now,
                )
            )
            .values(consumed_at=now, consumed_by_instance=instance_id)
            .returning(t.id, t.role)
        )
    ).first()
    return ConsumedToken(row.id, row.role) if row else None


async def join_token_refusal(conn: AsyncConnection, token_hash: str, now: datetime) -> str | None:
    """Why a join token is refused (`token_unknown|revoked|expired|used`), or None while it is fresh.

    A token is single use whoever presents it, its own consumer included: a replay of a used token
    must never issue a credential (it would retire the live one, or undo a revocation).
    """
    t = join_tokens.c
    row = (
        await conn.execute(
            select(t.expires_at, t.revoked_at, t.consumed_at).where(t.token_hash == token_hash)
        )
    ).first()
    if row is None:
        return "token_unknown"
    if row.revoked_at is not None:
        return "token_revoked"
    if row.expires_at <= now:
        return "token_expired"
    if row.consumed_at is not None:
        return "token_used"
    return None


async def has_live_credential(conn: AsyncConnection, instance_id: str, now: datetime) -> bool:
    """Whether the instance holds an active credential (neither superseded, revoked nor expired)."""
    c = peer_credentials.c
    row = (
        await conn.execute(
            select(c.id)
            .where(
                and_(
                    c.instance_id == instance_id,
                    c.rotated_at.is_(None),
                    c.revoked_at.is_(None),
                    c.expires_at > now,
                )
            )
            .limit(1)
        )
    ).first()
    return row is not None


async def replace_credential(
    conn: AsyncConnection,
    *,
    instance_id: str,
    role: str,
    stored_key: bytes,
    server_key: bytes,
    join_token_id: str | None,
    now: datetime,
    expires_at: datetime,
    validated_by: str,
) -> str:
    """Insert the instance's new active credential, marking the previous active one rotated; its id."""
    c = peer_credentials.c
    await conn.execute(
        update(peer_credentials)
        .where(and_(c.instance_id == instance_id, c.rotated_at.is_(None), c.revoked_at.is_(None)))
        .values(rotated_at=now)
    )
    credential_id = new_id()
    await conn.execute(
        insert(peer_credentials).values(
            id=credential_id,
            instance_id=instance_id,
            role=role,
            stored_key=stored_key,
            server_key=server_key,
            join_token_id=join_token_id,
            created_at=now,
            expires_at=expires_at,
            last_seen_at=now,
            last_validated_by=validated_by,
        )
    )
    return credential_id


async def latest_credential(conn: AsyncConnection, instance_id: str) -> CredentialRow | None:
    """The instance's newest credential row (the active one, or the revoked one that replaced none)."""
    c = peer_credentials.c
    row = (
        await conn.execute(
            select(peer_credentials)
            .where(and_(c.instance_id == instance_id, c.rotated_at.is_(None)))
            .order_by(c.created_at.desc(), c.id.desc())
            .limit(1)
        )
    ).first()
    return _credential(row) if row else None


async def touch_credential(
    conn: AsyncConnection, credential_id: str, now: datetime, validated_by: str
) -> None:
    """Record a successful proof."""
    await conn.execute(
        update(peer_credentials)
        .where(peer_credentials.c.id == credential_id)
        .values(last_seen_at=now, last_validated_by=validated_by)
    )


async def revoke_credentials(conn: AsyncConnection, instance_id: str, now: datetime) -> int:
    """Set `revoked_at` on every unrevoked credential of the instance; how many."""
    c = peer_credentials.c
    result = await conn.execute(
        update(peer_credentials)
        .where(and_(c.instance_id == instance_id, c.revoked_at.is_(None)))
        .values(revoked_at=now)
    )
    return int(result.rowcount or 0)


async def credential_known(conn: AsyncConnection, instance_id: str) -> bool:
    """Whether any credential row was ever issued for the instance."""
    row = (
        await conn.execute(
            select(peer_credentials.c.id).where(peer_credentials.c.instance_id == instance_id).limit(1)
        )
    ).first()
    return row is not None


async def revoked_among(conn: AsyncConnection, credential_ids: list[str]) -> set[str]:
    """Which of these credential ids are revoked now (the backstop re-check of live sessions)."""
    if not credential_ids:
        return set()
    c = peer_credentials.c
    rows = await conn.execute(select(c.id).where(and_(c.id.in_(credential_ids), c.revoked_at.is_not(None))))
    return {r.id for r in rows}


async def credentials_by_instance(conn: AsyncConnection) -> dict[str, CredentialRow]:
    """Each instance's newest credential row (for the peer list)."""
    c = peer_credentials.c
    rows = await conn.execute(
        select(peer_credentials).where(c.rotated_at.is_(None)).order_by(c.created_at.asc(), c.id.asc())
    )
    found: dict[str, CredentialRow] = {}
    for row in rows:
        credential = _credential(row)
        found[credential.instance_id] = credential  # later rows win
    return found


async def rotate_credential(
    conn: AsyncConnection,
    *,
    previous_id: str,
    instance_id: str,
    role: str,
    stored_key: bytes,
    server_key: bytes,
    now: datetime,
    expires_at: datetime,
    validated_by: str,
) -> str | None:
    """Supersede `previous_id` with a new active row, only if it is still the active one; the new id.

    None when the row was revoked or already superseded meanwhile: inserting then would make a
    second active row (refused by the partial unique index) or resurrect a revoked peer.
    """
    c = peer_credentials.c
    result = await conn.execute(
        update(peer_credentials)
        .where(and_(c.id == previous_id, c.rotated_at.is_(None), c.revoked_at.is_(None)))
        .values(rotated_at=now)
    )
    if not result.rowcount:
        return None
    credential_id = new_id()
    await conn.execute(
        insert(peer_credentials).values(
            id=credential_id,
            instance_id=instance_id,
            role=role,
            stored_key=stored_key,
            server_key=server_key,
            join_token_id=None,
            created_at=now,
            expires_at=expires_at,
            last_seen_at=now,
            last_validated_by=validated_by,
        )
    )
    return credential_id


async def prune_join_tokens(conn: AsyncConnection, expired_before: datetime) -> int:
    """Delete join tokens that expired before `expired_before`; how many."""
    result = await conn.execute(delete(join_tokens).where(join_tokens.c.expires_at < expired_before))
    return int(result.rowcount or 0)


# --- job rerouting (docs/design/cluster.md §4)


@dataclass(frozen=True)
class RerouteHolder:
    """Who holds a job now, and where it stands."""

    status: str
    rerouted_to: str | None
    agent_id: str | None
    window_expires_at: datetime | None
    run_id: str = ""

    @property
    def window_armed(self) -> bool:
        """Whether the spawn window runs (accepted, not started)."""
        return self.window_expires_at is not None


async def extend_offer_deadline(
    conn: AsyncConnection, *, job_id: str, claimed_by: str, attempt: int, ack_deadline: datetime
) -> bool:
    """Give a claim offered to a worker the offer's own ack deadline (docs/design/cluster.md §4.2): the
    dispatcher's claim carried the agents' shorter `dispatch_ack_timeout_ms`, and the ack sweep would take
    the row back while the worker may still accept in time."""
    extended = await conn.execute(
        update(dispatch_queue)
        .where(
            dispatch_queue.c.job_id == job_id,
            dispatch_queue.c.state == "claimed",
            dispatch_queue.c.agent_id == claimed_by,
            dispatch_queue.c.attempts == attempt,
        )
        .values(ack_deadline=ack_deadline)
    )
    return bool(extended.rowcount)


async def reroute_holder(conn: AsyncConnection, job_id: str) -> RerouteHolder | None:
    """The job's status and holder (call after `lock_job_for_change` when the answer guards a write)."""
    row = (
        await conn.execute(
            select(
                jobs.c.status,
                jobs.c.rerouted_to,
                jobs.c.agent_id,
                jobs.c.reroute_window_expires_at,
                jobs.c.run_id,
            ).where(jobs.c.id == job_id)
        )
    ).first()
    if row is None:
        return None
    return RerouteHolder(row.status, row.rerouted_to, row.agent_id, row.reroute_window_expires_at, row.run_id)


async def job_org(conn: AsyncConnection, job_id: str) -> str | None:
    """The org a job belongs to (None when there is no such job)."""
    return (await conn.execute(select(jobs.c.org_id).where(jobs.c.id == job_id))).scalar_one_or_none()


@dataclass(frozen=True)
class ArmedWindow:
    """A rerouted job's armed spawn window, and which coordinator owns its claim."""

    job_id: str
    worker: str
    owner: str | None
    expires_at: datetime


async def armed_windows(
    conn: AsyncConnection, *, owner: str | None = None, lapsed_by: datetime | None = None
) -> list[ArmedWindow]:
    """Armed spawn windows (the partial index's rows): those of `owner`'s claims, or those lapsed
    by `lapsed_by` (the leader's sweep), or all."""
    query = (
        select(
            jobs.c.id,
            jobs.c.rerouted_to,
            jobs.c.reroute_window_expires_at,
            dispatch_queue.c.owner_instance_id,
        )
        .select_from(jobs.outerjoin(dispatch_queue, dispatch_queue.c.job_id == jobs.c.id))
        .where(jobs.c.reroute_window_expires_at.is_not(None), jobs.c.rerouted_to.is_not(None))
    )
    if owner is not None:
        query = query.where(dispatch_queue.c.owner_instance_id == owner)
    if lapsed_by is not None:
        query = query.where(jobs.c.reroute_window_expires_at <= lapsed_by)
    rows = await conn.execute(query.order_by(jobs.c.reroute_window_expires_at))
    return [ArmedWindow(r.id, r.rerouted_to, r.owner_instance_id, r.reroute_window_expires_at) for r in rows]


async def mark_rerouted(
    conn: AsyncConnection,
    *,
    job_id: str,
    claimed_by: str,
    attempt: int,
    worker: str,
    hop: int,
    tried: list[str],
    spawn_max_attempts: int,
    spawn_retry_backoff_ms: int,
    window_expires_at: datetime,
) -> bool:
    """A worker accepted the offer: record it on the job and stop the claim's ack clock; False when
    the claim is no longer this offer's (given back or started meanwhile).

    A job cancelled while the offer waited (`cancelling`) is recorded too: the worker holds it now, so the
    cancel relay (`cancelling_rerouted`) tells that worker, and its `cancelled` is the holder's to report."""
    claimed = await conn.execute(
        update(dispatch_queue)
        .where(
            dispatch_queue.c.job_id == job_id,
            dispatch_queue.c.state == "claimed",
            dispatch_queue.c.agent_id == claimed_by,
            dispatch_queue.c.attempts == attempt,
        )
        .values(ack_deadline=None)
    )
    if not claimed.rowcount:
        return False
    await conn.execute(
        update(jobs)
        .where(jobs.c.id == job_id, jobs.c.status.in_(["dispatched", "cancelling"]))
        .values(
            rerouted_to=worker,
            reroute_hop=hop,
            reroute_tried=tried,
            reroute_spawn_max_attempts=spawn_max_attempts,
            reroute_spawn_retry_backoff_ms=spawn_retry_backoff_ms,
            reroute_spawn_failures=0,
            reroute_window_expires_at=window_expires_at,
        )
    )
    return True


async def move_claim(
    conn: AsyncConnection,
    *,
    job_id: str,
    attempt: int,
    from_agent: str,
    to_agent: str,
    owner: str,
    now: datetime,
    ack_deadline: datetime,
    outcome: str | None,
    detail: str | None,
    reason: str | None = None,
    ended_hop: int | None = None,
) -> bool:
    """Hand a claimed row from one worker's claim to another's (the next hop, docs/design/cluster.md §4.2);
    False when the row is no longer `from_agent`'s claim at `attempt` (cancelled, swept or moved meanwhile).

    The offer that ended (`outcome`, when not None) is written to `dispatch_history` with its
    `reason` and the hop it was offered at (`ended_hop`); the hop keeps the dispatch attempt.
    """
    q = dispatch_queue.c
    row = (
        await conn.execute(
            select(dispatch_queue).where(
                q.job_id == job_id, q.state == "claimed", q.agent_id == from_agent, q.attempts == attempt
            )
        )
    ).first()
    if row is None:
        return False
    if outcome is not None:
        await record_dispatch_ended(
            conn,
            job_id,
            row,
            ended_at=now,
            outcome=outcome,
            detail=detail,
            reason=reason,
            reroute_hop=ended_hop,
        )
    await conn.execute(
        update(dispatch_queue)
        .where(q.job_id == job_id, q.state == "claimed", q.agent_id == from_agent)
        .values(agent_id=to_agent, owner_instance_id=owner, claimed_at=now, ack_deadline=ack_deadline)
    )
    await conn.execute(
        update(jobs).where(jobs.c.id == job_id, jobs.c.status == "dispatched").values(agent_id=to_agent)
    )
    return True


async def hand_back_to_local(conn: AsyncConnection, job_id: str, *, tried: list[str], hop: int) -> None:
    """Hops or candidates ran out: record who was tried, which keeps workers from claiming the row
    again (`claim_for` with a worker's slot skips jobs whose `reroute_tried` is set)."""
    await conn.execute(update(jobs).where(jobs.c.id == job_id).values(reroute_tried=tried, reroute_hop=hop))


async def disarm_reroute_window(conn: AsyncConnection, job_id: str) -> None:
    """The holding worker reported progress: the spawn window no longer applies (docs/design/cluster.md §4.3
    Layer A)."""
    await conn.execute(update(jobs).where(jobs.c.id == job_id).values(reroute_window_expires_at=None))


@dataclass(frozen=True)
class SpawnBudget:
    """Where a rerouted job stands for Layer B (docs/design/cluster.md §4.3): holder, window and spawn-retry
    budget."""

    run_id: str
    org_id: str
    status: str
    rerouted_to: str | None
    window_expires_at: datetime | None
    failures: int
    max_attempts: int
    backoff_ms: int


async def spawn_budget(conn: AsyncConnection, job_id: str) -> SpawnBudget | None:
    """The job's holder, window and spawn-retry budget (after `lock_job_for_change`)."""
    j = jobs.c
    row = (
        await conn.execute(
            select(
                j.run_id,
                j.org_id,
                j.status,
                j.rerouted_to,
                j.reroute_window_expires_at,
                j.reroute_spawn_failures,
                j.reroute_spawn_max_attempts,
                j.reroute_spawn_retry_backoff_ms,
            ).where(j.id == job_id)
        )
    ).first()
    if row is None:
        return None
    return SpawnBudget(
        run_id=row.run_id,
        org_id=row.org_id,
        status=row.status,
        rerouted_to=row.rerouted_to,
        window_expires_at=row.reroute_window_expires_at,
        failures=int(row.reroute_spawn_failures or 0),
        max_attempts=int(row.reroute_spawn_max_attempts or 1),
        backoff_ms=int(row.reroute_spawn_retry_backoff_ms or 0),
    )


async def record_spawn_failure(conn: AsyncConnection, job_id: str, error: str) -> None:
    """A relayed spawn failure, as the job's last provisioning error."""
    await conn.execute(
        update(dispatch_queue)
        .where(dispatch_queue.c.job_id == job_id)
        .values(last_provisioning_error=error[:2000])
    )


async def count_spawn_failure(
    conn: AsyncConnection, job_id: str, worker: str, *, failures: int, window_expires_at: datetime | None
) -> bool:
    """Store the holder's failure count (and a re-armed window deadline); False when `worker` no
    longer holds an armed window for the job."""
    values: dict[str, Any] = {"reroute_spawn_failures": failures}
    if window_expires_at is not None:
        values["reroute_window_expires_at"] = window_expires_at
    result = await conn.execute(
        update(jobs)
        .where(
            jobs.c.id == job_id, jobs.c.rerouted_to == worker, jobs.c.reroute_window_expires_at.is_not(None)
        )
        .values(**values)
    )
    return bool(result.rowcount)


@dataclass(frozen=True)
class TakenBack:
    """A job re-dispatch took back from its worker (docs/design/cluster.md §4.4): where its offers stood, and
    its claim."""

    run_id: str
    org_id: str
    hop: int
    tried: list[str]
    claim_agent: str | None
    attempt: int


async def take_back(
    conn: AsyncConnection, job_id: str, worker: str, *, lapsed_by: datetime | None = None
) -> TakenBack | None:
    """docs/design/cluster.md §4.4's conditional update: take a not-yet-started job with an armed spawn window
    back from `worker`. Layer A, Layer B and the leader's sweep race on it, so exactly one caller gets the job
    (None for the others, and when the job started, ended or is held by someone else). With `lapsed_by` (a
    lapsed window) a window re-armed meanwhile to a later deadline is left alone."""
    conditions = [
        jobs.c.id == job_id,
        jobs.c.rerouted_to == worker,
        jobs.c.status.in_(["queued", "dispatched"]),
        jobs.c.reroute_window_expires_at.is_not(None),
    ]
    if lapsed_by is not None:
        conditions.append(jobs.c.reroute_window_expires_at <= lapsed_by)
    result = await conn.execute(
        update(jobs).where(*conditions).values(rerouted_to=None, reroute_window_expires_at=None)
    )
    if not result.rowcount:
        return None
    row = (
        await conn.execute(
            select(
                jobs.c.run_id,
                jobs.c.org_id,
                jobs.c.reroute_hop,
                jobs.c.reroute_tried,
                dispatch_queue.c.agent_id,
                dispatch_queue.c.attempts,
            )
            .select_from(jobs.outerjoin(dispatch_queue, dispatch_queue.c.job_id == jobs.c.id))
            .where(jobs.c.id == job_id)
        )
    ).one()
    return TakenBack(
        run_id=row.run_id,
        org_id=row.org_id,
        hop=int(row.reroute_hop or 1),
        tried=list(row.reroute_tried or []),
        claim_agent=row.agent_id,
        attempt=int(row.attempts or 0),
    )


async def set_job_agent(conn: AsyncConnection, job_id: str, agent_id: str) -> None:
    """The worker's agent that runs a rerouted job (`jobs.agent_id`; the queue row keeps the worker's)."""
    await conn.execute(update(jobs).where(jobs.c.id == job_id).values(agent_id=agent_id))


async def cancelling_rerouted(
    conn: AsyncConnection, workers: list[str]
) -> list[tuple[str, str, str, str | None]]:
    """`(job_id, run_id, worker, reason)` of jobs being cancelled that these workers hold."""
    rows = await conn.execute(
        select(jobs.c.id, jobs.c.run_id, jobs.c.rerouted_to, jobs.c.reason).where(
            jobs.c.status == "cancelling", jobs.c.rerouted_to.in_(workers)
        )
    )
    return [(row.id, row.run_id, row.rerouted_to, row.reason) for row in rows]
