"""A re-registration waits for the hand-over of the connection it replaces (docs/design/execution.md §6).

When an agent's connection closes and the agent connects again at once with the same id, the hub
handles the old connection's disconnect (agent offline, its dispatched jobs requeued) in a transaction
that can be overtaken: SQLite's busy handler is not first-come-first-served. If the new registration and
a claim for it commit first, the old disconnect marks the agent offline under a live connection and
requeues the job just dispatched to the new one (as the `never_acks` dispatch test saw on a loaded
machine: the second attempt's job vanished from under the agent). The hub orders the two per agent id.

The hub runs here with a real database and real journal; its sockets are `FakeAgentSocket`s, a faithful
stand-in for Starlette's `WebSocket` (accept, receive_text, send_text, close), so the test can hold the
old connection's disconnect in the middle.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import select
from starlette.websockets import WebSocketDisconnect

from conveyor.agents import store as agent_store
from conveyor.agents.hub import AgentConnection, AgentHub, HubSettings
from conveyor.agents.journal import DatabaseJournal
from conveyor.db.engine import Database
from conveyor.db.tables import agents
from conveyor.execution.lifecycle import Effects
from conveyor.model import protocol as p
from tests.support.waiting import async_wait_until


class FakeAgentSocket:
    """Starlette's `WebSocket` as the hub uses it: frames in from a queue, frames out to a list."""

    def __init__(self) -> None:
        self.inbound: asyncio.Queue[str | int] = asyncio.Queue()
        self.sent: list[dict[str, Any]] = []
        self.close_code: int | None = None

    async def accept(self) -> None:
        return None

    async def receive_text(self) -> str:
        item = await self.inbound.get()
        if isinstance(item, int):
            raise WebSocketDisconnect(item)
        return item

    async def send_text(self, text: str) -> None:
        self.sent.append(json.loads(text))

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.close_code = code
        await self.inbound.put(code)

    def types(self) -> list[str]:
        return [frame["type"] for frame in self.sent]


class HeldDisconnectJournal(DatabaseJournal):
    """The real journal, whose disconnect hand-over waits until the test lets it go on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.disconnect_reached = asyncio.Event()
        self.release = asyncio.Event()

    async def disconnected(self, connection: AgentConnection, code: int) -> None:
        self.disconnect_reached.set()
        await self.release.wait()
        await super().disconnected(connection, code)


class IdleDispatcher:
    """The dispatcher as the hub sees it: the connected agents and a wake-up (no jobs here)."""

    def __init__(self) -> None:
        self.agents: dict[str, Any] = {}

    def wake(self) -> None:
        return None


async def _no_effects(_effects: Effects) -> None:
    return None


def hub_on(db: Database) -> tuple[AgentHub, HeldDisconnectJournal]:
    settings = HubSettings(heartbeat_ms=5000, dead_after_ms=60_000, recovery_grace_ms=60_000, max_attempts=2)
    dispatcher = IdleDispatcher()
    journal = HeldDisconnectJournal(
        db,
        dispatcher,
        owner=lambda: "c1",
        settings=settings,
        append_log=None,
        on_effects=_no_effects,
        on_job_changed=lambda _job_id: None,
        event_emitter=lambda: None,
    )
    hub = AgentHub(
        db,
        dispatcher,
        owner=lambda: "c1",
        settings=settings,
        append_log=None,
        on_effects=_no_effects,
        journal=journal,
    )
    return hub, journal


async def connect(hub: AgentHub, token: str) -> tuple[FakeAgentSocket, asyncio.Task[None]]:
    socket = FakeAgentSocket()
    await socket.inbound.put(p.AuthRequest(token=token).model_dump_json())
    await socket.inbound.put(p.AgentRegister(agent_id="silent", labels=["linux"]).model_dump_json())
    return socket, asyncio.create_task(hub.serve(socket))  # type: ignore[arg-type]


async def agent_state(db: Database) -> str:
    async with db.read() as conn:
        return str(
            (await conn.execute(select(agents.c.state).where(agents.c.agent_id == "silent"))).scalar_one()
        )


def saw(socket: FakeAgentSocket, frame_type: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return frame_type in socket.types()

    return check


async def test_a_reregistration_waits_for_the_old_connections_disconnect(database: Database) -> None:
    async with database.transaction() as conn:
        token, _ = await agent_store.mint_agent_token(
            conn, labels=["linux"], mandatory_labels=[], label="t", created_by="test"
        )
    hub, journal = hub_on(database)
    first, first_task = await connect(hub, token)
    await async_wait_until(saw(first, "register.ack"), timeout=30, what="the first registration")

    await first.close(p.CLOSE_ACK_TIMEOUT)  # as the ack-deadline sweep closes it
    await asyncio.wait_for(journal.disconnect_reached.wait(), 30)
    second, second_task = await connect(hub, token)
    await async_wait_until(
        saw(second, "auth.success"), timeout=30, what="the second connection authenticated"
    )
    # While the old connection's hand-over is held, the new registration must not complete. Before the
    # fix it did within milliseconds, and the hand-over then marked the live agent offline.
    try:
        await async_wait_until(saw(second, "register.ack"), timeout=2, what="an early registration")
        registered_early = True
    except AssertionError:
        registered_early = False

    journal.release.set()
    await asyncio.wait_for(first_task, 30)
    await async_wait_until(saw(second, "register.ack"), timeout=30, what="the second registration")
    assert not registered_early, "the new registration went ahead of the old connection's disconnect"
    assert await agent_state(database) == "online"
    assert hub.connections["silent"].websocket is second  # type: ignore[comparison-overlap]
    await second.close(p.CLOSE_NORMAL)
    await asyncio.wait_for(second_task, 30)
    assert await agent_state(database) == "offline"
