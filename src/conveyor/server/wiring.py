"""Where the server's parts are plugged in: admin routers and start-up hooks, in order.

Each domain package exposes its admin `router` and, when it runs background work, a start-up hook
`async def start(state: <Its>Node) -> Sequence[Component]` that runs once the database is ready
(in the order listed; a hook may raise `FatalStartupError` to stop the node). Hooks may publish
services for later hooks and routes in `state.parts`. A hook takes the `ServerState` as a Protocol of
what it reads (`conveyor.runtime.node.Node`), since it may not import `server`: the tuples below are where
mypy checks that `ServerState` has all of it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from fastapi import APIRouter

from conveyor.admin.routes import access_log as access_log_routes
from conveyor.admin.routes import db_status as db_status_routes
from conveyor.admin.routes import tokens as token_routes
from conveyor.agents import endpoint as agent_endpoint
from conveyor.agents import routes as agent_routes
from conveyor.agents import startup as agent_startup
from conveyor.agents.hub import AGENT_HUB
from conveyor.artifacts import routes as artifact_routes
from conveyor.artifacts import startup as artifact_startup
from conveyor.artifacts.routes import ARTIFACTS
from conveyor.artifacts.summary import job_test_summary
from conveyor.cluster import drain_routes, transfer_proxy
from conveyor.cluster import routes as cluster_routes
from conveyor.cluster import startup as cluster_startup
from conveyor.events import routes as event_routes
from conveyor.events import startup as event_startup
from conveyor.events import summon_routes
from conveyor.execution import log_routes, log_service
from conveyor.execution import routes as execution_routes
from conveyor.execution.dispatcher import DISPATCHER
from conveyor.ingest import badges, webhooks
from conveyor.ingest import routes as ingest_routes
from conveyor.ingest import startup as ingest_startup
from conveyor.ingest.service import INGEST
from conveyor.ingest.startup import INTAKE_PARTS
from conveyor.runtime import boot as runtime_boot
from conveyor.runtime import routes as runtime_routes
from conveyor.runtime.node import Component, FatalStartupError
from conveyor.scaler import claim_route
from conveyor.scaler import routes as scaler_routes
from conveyor.scaler import startup as scaler_startup
from conveyor.secrets import routes as secret_routes
from conveyor.secrets import startup as secret_startup
from conveyor.server import retention, support_node, support_routes
from conveyor.server.state import ServerState, StartupHook

ADMIN_ROUTERS: tuple[APIRouter, ...] = (
    token_routes.router,
    access_log_routes.router,
    db_status_routes.router,
    runtime_routes.router,
    secret_routes.router,
    ingest_routes.router,
    execution_routes.router,
    agent_routes.router,
    log_routes.router,
    artifact_routes.router,
    scaler_routes.router,
    event_routes.router,
    cluster_routes.router,
    drain_routes.router,
    support_routes.router,  # docs/design/admin.md §8.1
)

# Routes outside the admin API (their own authentication).
APP_ROUTERS: tuple[APIRouter, ...] = (
    webhooks.router,
    agent_endpoint.router,
    claim_route.router,
    artifact_routes.transport_router,
    summon_routes.router,  # a job's credential: docs/design/execution.md §8.6
    cluster_routes.socket_router,
    cluster_routes.health_router,
    badges.router,  # no token: a source's `public_badges` decides (docs/design/execution.md §11)
)
# A worker serves its probes, `/cluster/health`, its agents' `/ws`, their transfer routes (forwarded) and its
# drain routes (no admin API, no `/ws/peer`): docs/design/cluster.md §1, §8.
WORKER_ROUTERS: tuple[APIRouter, ...] = (
    cluster_routes.health_router,
    cluster_routes.worker_socket_router,
    agent_endpoint.router,
    drain_routes.worker_router,  # `POST /drain`, `/resume` behind CONVEYOR_WORKER_ADMIN_TOKEN
    transfer_proxy.router,  # its agents' artifact and cache routes, forwarded (docs/design/artifacts.md §4)
)


async def start_artifacts(state: ServerState) -> Sequence[Component]:
    """The artifacts hook; a blob store that cannot be used stops the node. A job's check run then
    carries its test summary (the reporter's seam: `ingest` and `artifacts` share a layer)."""
    try:
        components = await artifact_startup.start(state)
    except artifact_startup.BlobStoreSetupError as error:
        raise FatalStartupError(f"the blob store cannot be used: {error}") from None
    intake = state.parts.get(INTAKE_PARTS)
    if intake is not None:
        intake.reporter.details = functools.partial(job_test_summary, state.db)
    artifacts, dispatcher = state.parts.get(ARTIFACTS), state.parts.get(DISPATCHER)
    if artifacts is not None and dispatcher is not None:
        dispatcher.digest_first = artifacts.blob_store.prefers_digest_first
        dispatcher.direct_downloads = artifacts.direct_downloads
    return components


async def start_events(state: ServerState) -> Sequence[Component]:
    """The events hook, then its producers plugged into the agent hub and the ingest pipeline (siblings of
    `events` in the layer table, so they meet here)."""
    components = await event_startup.start(state)
    producers = state.parts.get(event_startup.EVENT_PRODUCERS)
    if producers is not None:
        ingest = state.parts.get(INGEST)
        producers.install(agent_hub=state.parts.get(AGENT_HUB), pipeline=ingest.pipeline if ingest else None)
    return components


STARTUP_HOOKS: tuple[StartupHook, ...] = (
    # Before the identity is settled: what storing a webhook needs (docs/design/cluster.md §1).
    runtime_boot.prepare,
    secret_startup.start,
    ingest_startup.publish_intake,
    # Settles the identity; on PostgreSQL the listener opens if that means waiting out a crashed
    # predecessor's row. Everything after it (leadership, processing, dispatch) runs once it is settled.
    runtime_boot.start,
    secret_startup.advertise,
    cluster_startup.start,
    ingest_startup.start,
    log_service.start,
    agent_startup.start,
    cluster_startup.wire_agent_token_revocation,
    scaler_startup.start,
    cluster_startup.wire_drain,
    start_events,
    cluster_startup.start_reroute,
    retention.start,
    start_artifacts,
    support_node.start,  # this node's part of a support bundle, and the peer answer (docs/design/admin.md §8.1)
)

# A worker has no database: the peer hub, its agent hub, scaler and held jobs start in one hook.
WORKER_STARTUP_HOOKS: tuple[StartupHook, ...] = (cluster_startup.start_worker, support_node.start)
