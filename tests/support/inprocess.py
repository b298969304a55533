"""An in-process server (the real app, middleware and lifespan) for fast HTTP-level tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import APIRouter, FastAPI

from conveyor.admin import store
from conveyor.server.app import create_app
from conveyor.server.config import load_settings
from conveyor.server.run import build_state
from conveyor.server.state import ServerState
from tests.support.waiting import async_wait_until


@dataclass
class InProcessServer:
    """The app plus what tests need to drive it."""

    app: FastAPI
    state: ServerState
    client: httpx.AsyncClient
    owner_token: str

    def auth(self, token: str | None = None) -> dict[str, str]:
        """Authorization header for `token` (the owner's by default)."""
        return {"Authorization": f"Bearer {token or self.owner_token}"}

    async def mint(self, role: str, routing_key: str | None = None) -> str:
        """A token of `role` made straight in the database."""
        async with self.state.db.transaction() as conn:
            plaintext, _ = await store.insert_token(
                conn, role=role, created_by="test", routing_key=routing_key
            )
        return plaintext


# Longer than any stale window an in-process test configures.
STARTUP_TIMEOUT_S = 60


def _start_up_over(state: ServerState) -> Callable[[], Awaitable[bool]]:
    async def over() -> bool:
        return state.startup.started or state.startup.fatal is not None

    return over


@asynccontextmanager
async def in_process_server(
    database_url: str,
    home: Path,
    *,
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
    extra_admin_routers: Sequence[APIRouter] = (),
) -> AsyncIterator[InProcessServer]:
    """Start the app's lifespan on a migrated database; yield a client bound to it (`config_file`: a YAML
    file of settings, below `env`, as `conveyor server --config`)."""
    environ: dict[str, Any] = {
        "CONVEYOR_HOME": str(home),
        "CONVEYOR_DATABASE_URL": database_url,
        **(env or {}),
    }
    if database_url.startswith("sqlite"):
        environ.pop("CONVEYOR_DATABASE_URL")
        environ["CONVEYOR_HOME"] = str(Path(database_url.removeprefix("sqlite:///")).parent)
    settings = load_settings(config_file=config_file, environ=environ)
    state = build_state(settings)
    state.startup.done = True
    state.startup.detail = "recovery finished"
    async with state.db.transaction() as conn:
        owner, _ = await store.insert_token(conn, role="owner", created_by="test")
    app = create_app(state, extra_admin_routers=extra_admin_routers)
    async with app.router.lifespan_context(app):
        # The lifespan returns early when start-up waits (a live row of this instance id, PostgreSQL):
        # tests see the node once its start-up finished or failed, as before.
        await async_wait_until(
            _start_up_over(state), timeout=STARTUP_TIMEOUT_S, what="the in-process server's start-up"
        )
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            yield InProcessServer(app=app, state=state, client=client, owner_token=owner)
