"""The dispatcher: hands queued jobs to this node's connected agents, one claim at a time
(docs/design/execution.md §5).

Woken by NOTIFY / the in-process signal when rows are enqueued or capacity frees up, with a poll
as the fallback. Secrets and clone credentials are resolved after the claim commits and travel in
the `job.dispatch` message only.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.engine import Database, retry_transient
from conveyor.db.tables import jobs, runs
from conveyor.execution.lifecycle import Effects, finish_job
from conveyor.execution.queue import AgentSlot, Claim, claim_for, requeue, set_job_token
from conveyor.model.ids import new_id, utc_now
from conveyor.model.job_tokens import mint_job_token
from conveyor.model.protocol import ArtifactAccess, JobDispatch, RepoSpec, WorkflowSpec
from conveyor.model.tokens import hash_token
from conveyor.parts import PartKey
from conveyor.runtime.loops import WakeableLoop

log = logging.getLogger(__name__)

# Tries at building a claimed job's dispatch (rows, secrets) before the claim is given back.
BUILD_ATTEMPTS = 5
# A claim whose dispatch could not be built waits this long before the next try (not a hot loop).
GIVE_BACK_DELAY_MS = 1000


@dataclass(frozen=True)
class Resolved:
    """What a job gets at dispatch: environment, secrets and how to clone."""

    env: dict[str, str]
    secrets: dict[str, str]
    clone_url: str
    auth_header: str | None
    # A global workflow's repository (docs/design/global_workflows.md §5); None for every other run.
    workflow_repo: RepoSpec | None = None


@dataclass(frozen=True)
class Refused:
    """The job cannot be dispatched (e.g. `environment_not_found`): it fails with this reason."""

    reason: str


class DispatchResources(Protocol):
    """Secrets, variables, environments and clone credentials (wired by the server)."""

    async def resolve(
        self, conn: AsyncConnection, run: dict[str, Any], job: dict[str, Any]
    ) -> Resolved | Refused:
        """Everything a job needs beyond its rows, or why it may not run."""
        ...


class AgentLink(Protocol):
    """A connected agent as the dispatcher sees it."""

    agent_id: str

    def free_slot(self) -> AgentSlot | None:
        """The agent's labels when it can take one more job now (capacity, not draining, a single-use
        agent not yet sent its job)."""
        ...

    def idle_since(self) -> float:
        """Monotonic time the agent last became idle (longest idle is served first)."""
        ...

    def bound_job_id(self) -> str | None:
        """The only job the agent may be sent (a scaler-spawned agent's bound job); None: any it matches."""
        ...

    async def offer(self, dispatch: JobDispatch) -> bool:
        """Send `job.dispatch`; False when the socket is gone."""
        ...


@dataclass
class Dispatcher:
    """This node's dispatcher."""

    db: Database
    resources: DispatchResources
    owner: Callable[[], str]
    ack_timeout_ms: Callable[[], Awaitable[int]]
    max_attempts: int
    poll_s: float
    log_max_bytes: int
    on_effects: Callable[[Effects], Awaitable[None]] | None = None
    # Set by the artifacts hook from its blob store: agents hash an upload first (ArtifactAccess).
    digest_first: bool = False
    direct_downloads: bool = False
    agents: dict[str, AgentLink] = field(default_factory=dict)
    # Woken with the dispatcher: the scaler, so a job no connected agent can take gets its agent started
    # at once instead of at the scaler's next poll.
    also_wake: list[Callable[[], None]] = field(default_factory=list)
    # While this returns True the node drains (docs/design/cluster.md §8): no `dispatch_queue` row is claimed.
    paused: Callable[[], bool] = lambda: False
    _loop: WakeableLoop | None = None

    def wake(self) -> None:
        """Something changed: rows enqueued, capacity freed, an agent connected."""
        if self._loop is not None:
            self._loop.wake()
        for wake in self.also_wake:
            wake()

    async def start(self) -> None:
        """Begin dispatching."""
        self._loop = WakeableLoop("dispatcher", self.dispatch_round, self.poll_s, log)
        await self._loop.start()

    async def stop(self) -> None:
        """Stop dispatching."""
        if self._loop is not None:
            await self._loop.stop()

    async def dispatch_round(self) -> int:
        """Serve every agent with a free slot until nothing more matches; return dispatches sent."""
        sent = 0
        progress = True
        while progress:
            progress = False
            for link in sorted(self.agents.values(), key=lambda a: a.idle_since()):
                if self.paused():
                    return sent
                slot = link.free_slot()
                if slot is None:
                    continue
                if await self._dispatch_one(link, slot):
                    sent += 1
                    progress = True
        return sent

    async def _dispatch_one(self, link: AgentLink, slot: AgentSlot) -> bool:
        ack_timeout = await self.ack_timeout_ms()
        async with self.db.transaction() as conn:
            # A bound agent claims its job or nothing: never another spawn's job nor an unbound one
            # (docs/design/execution.md §5, "Single use").
            claim = await claim_for(
                conn,
                slot,
                owner=self.owner(),
                now=utc_now(),
                ack_timeout_ms=ack_timeout,
                bound_job_id=link.bound_job_id(),
            )
        if claim is None:
            return False
        try:
            dispatch = await self._build_retrying(claim)
        except Exception:
            # The claim is committed but nothing was sent: give it back now rather than let it
            # wait out the ack deadline and count as the agent's ack timeout.
            log.exception("building the dispatch of job %s failed; giving the claim back", claim.job_id)
            await self._give_back(claim, slot, "dispatch could not be built", delay_ms=GIVE_BACK_DELAY_MS)
            return True
        if dispatch is None:
            return True
        if not await link.offer(dispatch):
            await self._give_back(claim, slot, "send failed")
        return True

    async def build_dispatch(self, claim: Claim) -> JobDispatch | None:
        """The `job.dispatch` of a job claimed earlier (rerouting's next hop, docs/design/cluster.md §4.4):
        rows and secrets read again; None when the job may not run (it was failed)."""
        return await self._build_retrying(claim)

    async def _build_retrying(self, claim: Claim) -> JobDispatch | None:
        """`_build`, retried while the database says a retry may succeed (a busy pool, a deadlock)."""
        return await retry_transient(
            lambda: self._build(claim),
            attempts=BUILD_ATTEMPTS,
            what=f"the dispatch of job {claim.job_id}",
            log=log,
        )

    async def _give_back(self, claim: Claim, slot: AgentSlot, detail: str, delay_ms: int = 0) -> None:
        async with self.db.transaction() as conn:
            effects = await requeue(
                conn,
                claim.job_id,
                outcome="agent_lost",
                detail=detail,
                now=utc_now(),
                delay_ms=delay_ms,
                max_attempts=self.max_attempts,
                agent_id=slot.agent_id,
                attempt=claim.attempt,
            )
        await self._after(effects)

    async def _build(self, claim: Claim) -> JobDispatch | None:
        async with self.db.transaction() as conn:
            job = dict((await conn.execute(select(jobs).where(jobs.c.id == claim.job_id))).one()._mapping)
            run = dict((await conn.execute(select(runs).where(runs.c.id == claim.run_id))).one()._mapping)
            resolved = await self.resources.resolve(conn, run, job)
            if isinstance(resolved, Refused):
                effects = await finish_job(
                    conn, claim.job_id, "failed", reason=resolved.reason, queue_outcome="finished"
                )
            else:
                effects = None
                upstream = await upstream_results(conn, claim.run_id)
                # A new credential per dispatch: an earlier claim's token stops working here.
                job_token = mint_job_token()
                await set_job_token(conn, claim.job_id, claim.attempt, hash_token(job_token))
        if effects is not None:
            await self._after(effects)
            return None
        assert isinstance(resolved, Resolved)
        lock = run["workflow_lock"] or {}
        job_entry: dict[str, Any] = next(
            (j for j in lock.get("jobs", []) if j.get("name") == job["name"]), {}
        )
        event = run["event"] or {}
        return JobDispatch(
            id=new_id(),
            job_id=claim.job_id,
            run_id=claim.run_id,
            attempt=claim.attempt,
            repo=RepoSpec(
                clone_url=resolved.clone_url,
                ref=run["ref"],
                sha=run["sha"] or "",
                auth_header=resolved.auth_header,
            ),
            workflow=WorkflowSpec(
                # The name the workflow file defines: a global run's `workflow` is `<policy>/<name>`.
                name=lock.get("name") or run["workflow"],
                file=lock.get("source", {}).get("file", ""),
                content_hash=lock.get("content_hash", ""),
                hashed_files=list(lock.get("hashed_files", [])),
                repo=resolved.workflow_repo,
            ),
            job={**job_entry, "display_name": job["display_name"], "matrix": job["matrix"]},
            env={**resolved.env, **{k: str(v) for k, v in (job_entry.get("env") or {}).items()}},
            secrets=resolved.secrets,
            upstream=upstream,
            context={
                "event": event,
                "run_id": claim.run_id,
                "routing_key": run["routing_key"],
                "workflow_lock": lock,
            },
            log_max_bytes=self.log_max_bytes,
            artifacts=ArtifactAccess(
                token=job_token, digest_first=self.digest_first, direct_downloads=self.direct_downloads
            ),
        )

    async def _after(self, effects: Effects | None) -> None:
        if effects is not None and self.on_effects is not None:
            await self.on_effects(effects)


async def upstream_results(conn: AsyncConnection, run_id: str) -> dict[str, Any]:
    """`{job: {status, outputs, by_matrix}}` of the run's terminal jobs, for `ctx.needs`."""
    from conveyor.model.needs import NeedMember, need_result

    # Creation order is matrix order: a run's jobs are inserted in one transaction, combination by
    # combination, and ids are time-ordered within a process.
    rows = await conn.execute(
        select(jobs.c.name, jobs.c.matrix_key, jobs.c.status, jobs.c.outputs)
        .where(jobs.c.run_id == run_id)
        .order_by(jobs.c.created_at, jobs.c.id)
    )
    grouped: dict[str, list[NeedMember]] = {}
    for row in rows:
        grouped.setdefault(row.name, []).append(NeedMember(row.matrix_key, row.status, row.outputs))
    results: dict[str, Any] = {}
    for name, members in grouped.items():
        result = need_result(members)
        if result is not None:
            results[name] = result
    return results


DISPATCHER = PartKey[Dispatcher]("dispatcher")
"""The coordinator's dispatcher, published by the agents hook; ingest and events wake it."""
