"""The dispatch start-up hook: resources for `job.dispatch`, the dispatcher, the agent hub, leader sweeps."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.agents.hub import AgentHub, HubSettings
from conveyor.db.channels import CANCEL_CHANNEL, DISPATCH_CHANNEL
from conveyor.db.listen import NotificationListener
from conveyor.db.tables import jobs, runs
from conveyor.execution import depth, log_store
from conveyor.execution.dispatcher import Dispatcher, Refused, Resolved
from conveyor.execution.lifecycle import Effects
from conveyor.execution.sweeps import SweepSettings, sweep
from conveyor.ingest.store import get_source
from conveyor.model.knobs import CLUSTER_KNOBS_BY_NAME, ORG_KNOBS_BY_NAME
from conveyor.runtime.instances import stale_window
from conveyor.runtime.node import Component, Node, NodeSettings

log = logging.getLogger(__name__)

SERVICE_KEY = "agent_hub"


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


def _job_changed_callback(state: Node) -> Any:
    logs = state.services.get("logs")
    if logs is None:
        return None
    return logs.job_changed


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
        return Resolved(
            env=await self._secrets.variables_for_job(conn, environment),
            secrets={} if fork else await self._secrets.secrets_for_job(conn, environment_name),
            clone_url=clone_url,
            auth_header=await self._clone_credential(source) if source is not None else None,
        )


async def start(state: DispatchNode) -> Sequence[Component]:
    """Publish the hub (`state.services["agent_hub"]`), start the dispatcher and register the leader sweep."""
    from conveyor.runtime.boot import runtime_services
    from conveyor.runtime.lease import LeaderTask

    if state.settings.cluster_role != "coordinator":
        return []
    runtime = runtime_services(state.services)
    ingest = state.services.get("ingest")
    reporter = state.services.get("status_reporter")

    async def clone_credential(source: Any) -> str | None:
        return await ingest.pipeline.clone_credential(source) if ingest is not None else None

    depth_knob = CLUSTER_KNOBS_BY_NAME[depth.QUEUE_MAX_DEPTH]
    depth.DEFAULT.value = int(state.settings.knob_default(depth_knob) or depth.DEFAULT.value)
    ack_knob = ORG_KNOBS_BY_NAME["dispatch_ack_timeout_ms"]
    grace_knob = CLUSTER_KNOBS_BY_NAME["unroutable_grace_ms"]

    async def ack_timeout_ms() -> int:
        value = await runtime.settings.org_value("default", ack_knob.name)
        return int(value if value is not None else state.settings.knob_default(ack_knob) or 10_000)

    async def unroutable_grace_ms() -> int:
        value = await runtime.settings.cluster_value(grace_knob.name)
        return int(value if value is not None else state.settings.knob_default(grace_knob) or 0)

    queue_knob = ORG_KNOBS_BY_NAME["queue_timeout_ms"]
    wait_knob = CLUSTER_KNOBS_BY_NAME["concurrency_wait_timeout_ms"]

    async def queue_timeout_ms(org_id: str) -> int:
        value = await runtime.settings.org_value(org_id, queue_knob.name)
        return int(value if value is not None else state.settings.knob_default(queue_knob) or 0)

    async def concurrency_wait_timeout_ms() -> int:
        value = await runtime.settings.cluster_value(wait_knob.name)
        return int(value if value is not None else state.settings.knob_default(wait_knob) or 0)

    held_knob = CLUSTER_KNOBS_BY_NAME["held_run_retention_days"]

    async def held_run_retention_days() -> int:
        value = await runtime.settings.cluster_value(held_knob.name)
        return int(value if value is not None else state.settings.knob_default(held_knob) or 0)

    resources = ServerDispatchResources(state.services["secrets"], clone_credential)
    dispatcher = Dispatcher(
        db=state.db,
        resources=resources,
        owner=lambda: runtime.identity.instance_id,
        ack_timeout_ms=ack_timeout_ms,
        max_attempts=state.settings.dispatch_max_attempts,
        poll_s=state.settings.dispatch_poll_ms / 1000,
        log_max_bytes=state.settings.log_max_step_bytes,
    )

    async def on_effects(effects: Effects) -> None:
        if effects.queued_jobs:
            dispatcher.wake()
        if reporter is not None:
            reporter.wake()

    dispatcher.on_effects = on_effects

    hub = AgentHub(
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
    state.services[SERVICE_KEY] = hub
    state.services["dispatcher"] = dispatcher
    state.services["agent_disconnector"] = hub.disconnect
    # This node's connections; the cluster hook adds the notice to the other coordinators.
    state.services["agent_kicker"] = hub.kick_token

    async def finalize_runs(run_ids: list[str]) -> None:
        """After `queue clear`: runs whose last jobs were cancelled take their conclusion."""
        from conveyor.execution.lifecycle import conclude_run_if_done

        for run_id in run_ids:
            effects = Effects()
            async with state.db.transaction() as conn:
                await conclude_run_if_done(conn, run_id, effects)
            await on_effects(effects)

    state.services["run_finalizer"] = finalize_runs
    sweep_settings = SweepSettings(
        unroutable_grace_ms=unroutable_grace_ms,
        queue_timeout_ms=queue_timeout_ms,
        concurrency_wait_timeout_ms=concurrency_wait_timeout_ms,
        held_run_retention_days=held_run_retention_days,
        dead_after_ms=state.settings.agent_dead_after_ms,
        recovery_grace_ms=state.settings.recovery_grace_ms,
        max_attempts=state.settings.dispatch_max_attempts,
        instance_window=stale_window(
            state.settings.cluster_heartbeat_interval_ms, state.settings.cluster_peer_stale_beats
        ),
    )
    state.services["sweep_settings"] = sweep_settings  # the scaler adds its `scalable` rule

    async def leader_sweep(context: Any) -> None:
        async with state.db.transaction() as conn:
            results = await sweep(conn, sweep_settings)
            # Fence last: the lease row's share lock is then held only for the commit, so the
            # holder's own renewal (an UPDATE of that row) never waits behind a long sweep.
            await context.fence(conn)
        for effects in results:
            await on_effects(effects)

    runtime.leadership.register(LeaderTask("dispatch-sweep", state.settings.sweep_interval_ms, leader_sweep))
    await dispatcher.start()
    await hub.start()
    if state.db.dialect != "postgresql":
        return [dispatcher, hub]

    # Rows enqueued and cancels made on any coordinator wake this one's dispatcher and hub at once
    # (their polls stay the fallback). `conveyor_dispatch` (rows enqueued anywhere) wakes this node's dispatcher; `conveyor_cancel` (a
    # job set `cancelling` anywhere) wakes the hub, which tells its agent. A reconnect wakes both.
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
    return [dispatcher, hub, listener]
