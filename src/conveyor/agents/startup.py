"""The dispatch start-up hook: resources for `job.dispatch`, the dispatcher, the agent hub, leader sweeps."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.agents.hub import AGENT_HUB, AgentHub, HubSettings
from conveyor.agents.routes import DISCONNECTOR, KICKER, RUN_FINALIZER
from conveyor.db.channels import CANCEL_CHANNEL, DISPATCH_CHANNEL
from conveyor.db.listen import NotificationListener
from conveyor.db.tables import jobs, runs
from conveyor.execution import depth, fanout, log_store
from conveyor.execution.dispatcher import DISPATCHER, Dispatcher, Refused, Resolved
from conveyor.execution.lifecycle import Effects
from conveyor.execution.log_service import LOGS
from conveyor.execution.seams import AGENT_SWEEP, STATUS_REPORTER
from conveyor.execution.sweeps import SWEEP_SETTINGS, SweepSettings, sweep
from conveyor.ingest.service import INGEST
from conveyor.ingest.store import find_source, get_source
from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME, ORG_KNOBS_BY_NAME
from conveyor.model.protocol import RepoSpec
from conveyor.runtime.boot import RuntimeServices, runtime_services
from conveyor.runtime.instances import stale_window
from conveyor.runtime.lease import LeaderContext, LeaderTask
from conveyor.runtime.node import Component, Node, NodeSettings
from conveyor.secrets.service import SECRETS

log = logging.getLogger(__name__)


class DispatchSettings(NodeSettings, Protocol):
    """What the dispatch hook reads of the node's configuration."""

    agent_dead_after_ms: int
    recovery_grace_ms: int
    dispatch_max_attempts: int
    dispatch_poll_ms: int
    log_max_step_bytes: int
    cluster_heartbeat_interval_ms: int
    cluster_peer_stale_beats: int


class DispatchNode(Node, Protocol):
    """The node as the dispatch hook sees it."""

    @property
    def settings(self) -> DispatchSettings: ...


def _job_changed_callback(state: Node) -> Callable[[str], None] | None:
    logs = state.parts.get(LOGS)
    return logs.job_changed if logs is not None else None


class ServerDispatchResources:
    """Secrets and variables from the secret store; clone URL and credential from the source."""

    def __init__(self, secrets: Any, clone_credential: Any) -> None:
        self._secrets = secrets
        self._clone_credential = clone_credential

    async def secret_values(self, conn: AsyncConnection, job_id: str) -> list[str]:
        """The values of the secrets the job is given at dispatch, read again (none for a fork's job)."""
        row = (
            await conn.execute(
                select(jobs.c.environment, runs.c.event)
                .join(runs, runs.c.id == jobs.c.run_id)
                .where(jobs.c.id == job_id)
            )
        ).first()
        if row is None or (row.event or {}).get("is_fork"):
            return []
        return list((await self._secrets.secrets_for_job(conn, row.environment)).values())

    async def resolve(
        self, conn: AsyncConnection, run: dict[str, Any], job: dict[str, Any]
    ) -> Resolved | Refused:
        from conveyor.secrets import check_environment_for_dispatch

        environment_name = job.get("environment")
        environment = await self._secrets.environment(conn, environment_name) if environment_name else None
        branch = (run.get("event") or {}).get("branch")
        refusal = check_environment_for_dispatch(environment_name, environment, branch)
        if refusal is not None:
            return Refused(f"{refusal.code}: {refusal.detail}")
        source = await get_source(conn, run["source_id"]) if run["source_id"] else None
        clone_url = (source.clone_url or source.repo) if source else ""
        if source is not None and source.kind == "local" and not clone_url.startswith("file://"):
            clone_url = f"file://{source.repo}"
        event = run.get("event") or {}
        fork = bool(event.get("is_fork"))
        workflow_repo = await self._workflow_repo(conn, run) if run.get("global_source") else None
        if isinstance(workflow_repo, Refused):
            return workflow_repo
        return Resolved(
            env=await self._secrets.variables_for_job(conn, environment),
            secrets={} if fork else await self._secrets.secrets_for_job(conn, environment_name),
            clone_url=clone_url,
            auth_header=await self._clone_credential(source) if source is not None else None,
            workflow_repo=workflow_repo,
        )

    async def _workflow_repo(self, conn: AsyncConnection, run: dict[str, Any]) -> RepoSpec | Refused:
        """A global run's workflow repository: the policy source at the commit that registered the workflow
        (docs/design/global_workflows.md §5)."""
        origin = (run.get("trigger_trace") or {}).get("global") or {}
        policy = await find_source(conn, run["global_source"])
        sha = origin.get("commit_sha")
        if policy is None or not sha:
            return Refused(
                f"global_source_gone: policy source {run['global_source']} or its commit is unknown"
            )
        clone_url = policy.clone_url or policy.repo or ""
        if policy.kind == "local" and not clone_url.startswith("file://"):
            clone_url = f"file://{policy.repo}"
        return RepoSpec(
            clone_url=clone_url, ref=None, sha=str(sha), auth_header=await self._clone_credential(policy)
        )


@dataclass(frozen=True)
class DispatchKnobs:
    """The live knobs dispatch and its sweep read: the cluster/org override, else the configured default."""

    ack_timeout_ms: Callable[[], Awaitable[int]]
    unroutable_grace_ms: Callable[[], Awaitable[int]]
    queue_timeout_ms: Callable[[str], Awaitable[int]]
    concurrency_wait_timeout_ms: Callable[[], Awaitable[int]]
    held_run_retention_days: Callable[[], Awaitable[int]]


def dispatch_knobs(state: DispatchNode, runtime: RuntimeServices) -> DispatchKnobs:
    """Readers of the live knobs (and the queue depth limit's configured default, set here once)."""
    depth_knob = CLUSTER_KNOBS_BY_NAME[depth.QUEUE_MAX_DEPTH]
    depth.DEFAULT.value = int(state.settings.knob_default(depth_knob) or depth.DEFAULT.value)
    cap_knob = CLUSTER_KNOBS_BY_NAME[fanout.MAX_FANOUT_HOSTS]
    fanout.DEFAULT_CAP.value = int(state.settings.knob_default(cap_knob) or fanout.DEFAULT_CAP.value)

    def cluster(name: str) -> Callable[[], Awaitable[int]]:
        knob = CLUSTER_KNOBS_BY_NAME[name]

        async def read() -> int:
            value = await runtime.settings.cluster_value(knob.name)
            return int(value if value is not None else state.settings.knob_default(knob) or 0)

        return read

    def org(name: str, fallback: int) -> Callable[[str], Awaitable[int]]:
        knob = ORG_KNOBS_BY_NAME[name]

        async def read(org_id: str) -> int:
            value = await runtime.settings.org_value(org_id, knob.name)
            return int(value if value is not None else state.settings.knob_default(knob) or fallback)

        return read

    ack_timeout = org("dispatch_ack_timeout_ms", 10_000)

    async def ack_timeout_ms() -> int:
        return await ack_timeout("default")

    return DispatchKnobs(
        ack_timeout_ms=ack_timeout_ms,
        unroutable_grace_ms=cluster("unroutable_grace_ms"),
        queue_timeout_ms=org("queue_timeout_ms", 0),
        concurrency_wait_timeout_ms=cluster("concurrency_wait_timeout_ms"),
        held_run_retention_days=cluster("held_run_retention_days"),
    )


def build_resources(state: DispatchNode) -> ServerDispatchResources:
    """Secrets and variables from the secret store, the clone credential from the ingest pipeline."""
    ingest = state.parts.get(INGEST)

    async def clone_credential(source: Any) -> str | None:
        return await ingest.pipeline.clone_credential(source) if ingest is not None else None

    return ServerDispatchResources(state.parts.need(SECRETS), clone_credential)


def build_hub(
    state: DispatchNode,
    runtime: RuntimeServices,
    dispatcher: Dispatcher,
    resources: ServerDispatchResources,
    on_effects: Callable[[Effects], Awaitable[None]],
) -> AgentHub:
    """This node's agent hub, on the dispatcher."""
    return AgentHub(
        state.db,
        dispatcher,
        owner=lambda: runtime.identity.instance_id,
        settings=HubSettings(
            heartbeat_ms=min(15_000, state.settings.agent_dead_after_ms // 3),
            dead_after_ms=state.settings.agent_dead_after_ms,
            recovery_grace_ms=state.settings.recovery_grace_ms,
            max_attempts=state.settings.dispatch_max_attempts,
        ),
        append_log=log_store.append_protocol_chunk,
        on_effects=on_effects,
        on_job_changed=_job_changed_callback(state),
        secret_values=resources.secret_values,
    )


def build_sweep_settings(state: DispatchNode, knobs: DispatchKnobs) -> SweepSettings:
    """The leader sweep's settings (the scaler and cluster hooks add their rules to them)."""
    return SweepSettings(
        unroutable_grace_ms=knobs.unroutable_grace_ms,
        queue_timeout_ms=knobs.queue_timeout_ms,
        concurrency_wait_timeout_ms=knobs.concurrency_wait_timeout_ms,
        held_run_retention_days=knobs.held_run_retention_days,
        dead_after_ms=state.settings.agent_dead_after_ms,
        recovery_grace_ms=state.settings.recovery_grace_ms,
        max_attempts=state.settings.dispatch_max_attempts,
        instance_window=stale_window(
            state.settings.cluster_heartbeat_interval_ms, state.settings.cluster_peer_stale_beats
        ),
    )


def run_finalizer(
    state: DispatchNode, on_effects: Callable[[Effects], Awaitable[None]]
) -> Callable[[list[str]], Awaitable[None]]:
    """After `queue clear`: runs whose last jobs were cancelled take their conclusion."""
    from conveyor.execution.lifecycle import conclude_run_if_done

    async def finalize_runs(run_ids: list[str]) -> None:
        for run_id in run_ids:
            effects = Effects()
            async with state.db.transaction() as conn:
                await conclude_run_if_done(conn, run_id, effects)
            await on_effects(effects)

    return finalize_runs


def register_leader_sweep(
    state: DispatchNode,
    runtime: RuntimeServices,
    sweep_settings: SweepSettings,
    on_effects: Callable[[Effects], Awaitable[None]],
) -> None:
    """The leader's dispatch sweep: lost agents, unroutable and timed-out jobs, held runs."""

    async def leader_sweep(context: LeaderContext) -> None:
        async with state.db.transaction() as conn:
            results = await sweep(conn, sweep_settings)
            # Fence last: the lease row's share lock is then held only for the commit, so the
            # holder's own renewal (an UPDATE of that row) never waits behind a long sweep.
            await context.fence(conn)
        for effects in results:
            await on_effects(effects)

    runtime.leadership.register(LeaderTask("dispatch-sweep", state.settings.sweep_interval_ms, leader_sweep))


async def start_listener(state: DispatchNode, dispatcher: Dispatcher, hub: AgentHub) -> NotificationListener:
    """Rows enqueued and cancels made on any coordinator wake this one's dispatcher and hub at once (their polls
    stay the fallback): `conveyor_dispatch` wakes the dispatcher, `conveyor_cancel` (a job set `cancelling`
    anywhere) the hub, which tells its agent. A reconnect wakes both."""

    def wake_both() -> None:
        dispatcher.wake()
        hub.wake()

    listener = NotificationListener(
        state.db.url,
        {DISPATCH_CHANNEL: lambda _payload: dispatcher.wake(), CANCEL_CHANNEL: lambda _payload: hub.wake()},
        name="dispatch-listener",
        on_connect=wake_both,
    )
    await listener.start()
    return listener


async def start(state: DispatchNode) -> Sequence[Component]:
    """Publish the agent hub, the dispatcher and what the agents routes call; start them and register the
    leader sweep (coordinators only)."""
    if state.settings.cluster_role != "coordinator":
        return []
    runtime = runtime_services(state.parts)
    knobs = dispatch_knobs(state, runtime)
    resources = build_resources(state)
    dispatcher = Dispatcher(
        db=state.db,
        resources=resources,
        owner=lambda: runtime.identity.instance_id,
        ack_timeout_ms=knobs.ack_timeout_ms,
        max_attempts=state.settings.dispatch_max_attempts,
        poll_s=state.settings.dispatch_poll_ms / 1000,
        log_max_bytes=state.settings.log_max_step_bytes,
    )

    reporter = state.parts.get(STATUS_REPORTER)  # published by the ingest hook, which runs before this one

    async def on_effects(effects: Effects) -> None:
        if effects.queued_jobs:
            dispatcher.wake()
        if reporter is not None:
            reporter.wake()

    dispatcher.on_effects = on_effects
    hub = build_hub(state, runtime, dispatcher, resources, on_effects)
    sweep_settings = build_sweep_settings(state, knobs)
    state.parts.put(AGENT_HUB, hub)
    state.parts.put(AGENT_SWEEP, hub.sweep_once)
    state.parts.put(DISPATCHER, dispatcher)
    state.parts.put(DISCONNECTOR, hub.disconnect)
    state.parts.put(KICKER, hub.kick_token)  # this node's connections; the cluster hook tells the others too
    state.parts.put(RUN_FINALIZER, run_finalizer(state, on_effects))
    state.parts.put(SWEEP_SETTINGS, sweep_settings)  # the scaler adds its `scalable` rule
    register_leader_sweep(state, runtime, sweep_settings, on_effects)
    await dispatcher.start()
    await hub.start()
    if state.db.dialect != "postgresql":
        return [dispatcher, hub]
    return [dispatcher, hub, await start_listener(state, dispatcher, hub)]
