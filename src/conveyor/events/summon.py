"""Summoned runs (docs/design/execution.md §8.6): a running job's step starts a run of a workflow's `dispatch`
trigger, in its own source or, where trust allows, another source of the org. The gates are a pure decision
(`summon_refusal`); `SummonService` loads, decides, and starts the run through the manual run's own path."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from conveyor.db.engine import Database
from conveyor.errors import ConveyorError
from conveyor.events import admin_store
from conveyor.events.trust import Grant, summon_allowed
from conveyor.execution import store as execution_store
from conveyor.execution.creation import SummonLink
from conveyor.ingest import store as ingest_store
from conveyor.ingest.pipeline import DeliveryPipeline, ManualRunError
from conveyor.ingest.providers.base import SourceRow


class SummonRefused(ConveyorError):
    """A summon that may not start: the HTTP status, the API code and a sentence for the step."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class Summoner:
    """The summoning job and what of its run the gates look at."""

    job_id: str
    job_status: str
    run_id: str
    org_id: str
    routing_key: str | None
    repo: str
    branch: str | None
    sha: str | None
    source_id: str | None
    chain_depth: int
    is_fork: bool
    triggered_by: str | None

    @classmethod
    def of(cls, facts: Mapping[str, Any]) -> Summoner:
        event = facts.get("event") or {}
        return cls(
            job_id=facts["job_id"],
            job_status=facts["job_status"],
            run_id=facts["run_id"],
            org_id=facts["org_id"],
            routing_key=facts["routing_key"],
            repo=facts["repo"],
            branch=event.get("branch"),
            sha=facts["sha"],
            source_id=facts["source_id"],
            chain_depth=int(facts["chain_depth"] or 0),
            is_fork=bool(event.get("is_fork")),
            triggered_by=facts["triggered_by"],
        )


def repo_of(source: SourceRow) -> str:
    """The repository name a source's runs carry (a `local` source's is its name, as a manual run's)."""
    return source.name if source.kind == "local" else source.repo


# A job whose agent runs it. `dispatched`: its step can summon before the orchestrator has applied the agent's
# `job.started`, which is read ahead on the same connection (seen under load); `recovering`: its agent is lost
# to the orchestrator but may still run it, and summons again with the same request id if it comes back.
SUMMONING_STATUSES = frozenset({"dispatched", "running", "recovering"})


def summon_refusal(
    summoner: Summoner,
    target: SourceRow | None,
    target_name: str | None,
    workflow: str,
    grants: Iterable[Grant],
    max_chain_depth: int,
) -> SummonRefused | None:
    """The first gate a summon fails, in the order of docs/design/execution.md §8.6 (None: it may start)."""
    if summoner.job_status not in SUMMONING_STATUSES:
        return SummonRefused(409, "job_not_running", f"job {summoner.job_id} is {summoner.job_status}")
    if summoner.is_fork:
        return SummonRefused(403, "forbidden", "a job of a fork's pull request may not summon runs")
    if target is None or target.org_id != summoner.org_id:
        return SummonRefused(404, "unknown_repo", f"no source {target_name!r} in this organisation")
    if not summon_allowed(
        org_id=summoner.org_id,
        summoner_routing_key=summoner.routing_key,
        summoner_repo=summoner.repo,
        target_routing_key=target.routing_key,
        target_repo=repo_of(target),
        workflow=workflow,
        grants=grants,
    ):
        return SummonRefused(
            403,
            "untrusted",
            f"{summoner.routing_key} may not summon {workflow} of {target.routing_key}: no event trust grant"
            f" from {summoner.routing_key} to {target.routing_key} names summon:{workflow}",
        )
    depth = summoner.chain_depth + 1
    if depth >= max_chain_depth:
        return SummonRefused(
            409,
            "chain_depth_exceeded",
            f"chain depth {depth} reaches the limit of {max_chain_depth} (CONVEYOR_EVENTS_MAX_CHAIN_DEPTH)",
        )
    return None


class SummonService:
    """Start and read the runs a job summons."""

    def __init__(self, db: Database, pipeline: DeliveryPipeline, max_chain_depth: int) -> None:
        self.db = db
        self.pipeline = pipeline
        self.max_chain_depth = max_chain_depth

    async def summon(
        self, job_id: str, *, request_id: str, workflow: str, inputs: Mapping[str, Any], repo: str | None
    ) -> dict[str, Any]:
        """Start the run (or return the one this `request_id` started); `SummonRefused`."""
        async with self.db.read() as conn:
            facts = await execution_store.summoner_facts(conn, job_id)
            if facts is None:
                raise SummonRefused(404, "not_found", f"job {job_id}")
            summoner = Summoner.of(facts)
            if repo is None:
                target = (
                    await ingest_store.get_source(conn, summoner.source_id) if summoner.source_id else None
                )
            else:
                target = await ingest_store.find_source(conn, repo)
            grants = await admin_store.enabled_grants(conn, summoner.org_id)
        refusal = summon_refusal(
            summoner, target, repo or summoner.routing_key, workflow, grants, self.max_chain_depth
        )
        if refusal is not None:
            raise refusal
        assert target is not None
        own_source = target.id == summoner.source_id
        link = SummonLink(
            run_id=summoner.run_id,
            job_id=job_id,
            key=f"{job_id}:{request_id}",
            chain_depth=summoner.chain_depth + 1,
            branch=summoner.branch if own_source else None,
            sha=summoner.sha if own_source else None,
        )

        async def no_audit(_conn: Any, _run_id: str) -> None:
            return None

        try:
            started = await self.pipeline.start_manual_run(
                target,
                workflow=workflow,
                ref=None,
                inputs=inputs,
                sender=f"run {summoner.run_id}",
                audit=no_audit,
                triggered_by=summoner.triggered_by,
                summon=link,
            )
        except ManualRunError as exc:
            raise SummonRefused(400, exc.code, str(exc)) from exc
        return {
            "run_id": started["id"],
            "number": started["number"],
            "workflow": workflow,
            "routing_key": target.routing_key,
            "repo": repo_of(target),
            "status": started["status"],
            "created": started["created"],
        }

    async def status(self, job_id: str, run_id: str) -> dict[str, Any] | None:
        """A run this job summoned: status, reason and outputs (None: not one of its summons)."""
        async with self.db.read() as conn:
            row = await execution_store.summoned_run(conn, run_id, job_id)
        if row is None:
            return None
        return {
            "run_id": row["id"],
            "number": row["number"],
            "workflow": row["workflow"],
            "routing_key": row["routing_key"],
            "repo": row["repo"],
            "status": row["status"],
            "reason": row["reason"],
            "outputs": row["outputs"],
        }
