"""A FAKE of the orchestrator side of the agent protocol (docs/design/execution.md §6), for testing the agent
program.

This is not the orchestrator: it is a small scripted websockets server a test drives. It authenticates (or
refuses with `auth.failure` + close 4010), answers `agent.register` with `register.ack`, records every frame
an agent sends (each validated against `conveyor.model.protocol`), acknowledges durable statuses with
`status.ack {oseq}` (and `event.emit` with `event.emit.result`) unless told to withhold them, and lets the
test dispatch jobs, send cancels and drains, and drop or close the connection with any code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from conveyor.lockfile.reader import load_lock
from conveyor.model import protocol as p
from conveyor.model.ids import new_id
from tests.support.repos import git

DURABLE = ("step.finished", "job.finished", "event.emit")


@dataclass
class FakeAgentConnection:
    """One agent connection as the fake saw it."""

    index: int
    ws: ServerConnection
    messages: list[dict[str, Any]] = field(default_factory=list)
    register: dict[str, Any] | None = None
    registered_at: int | None = None  # index in `messages` after which register.ack was sent
    closed_code: int | None = None
    closed: bool = False

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        """Frames of one type on this connection, in arrival order."""
        return [message for message in self.messages if message["type"] == kind]


class FakeOrchestrator:
    """A scripted fake orchestrator on 127.0.0.1 (see the module docstring)."""

    def __init__(
        self, *, refuse_auth: str | None = None, heartbeat_ms: int = 15000, auth_after_register: bool = False
    ) -> None:
        self.refuse_auth = refuse_auth
        # Answer auth.request only once agent.register has arrived too: an agent that waits for
        # auth.success before registering then never registers (the handshake is one round trip).
        self.auth_after_register = auth_after_register
        self.heartbeat_ms = heartbeat_ms
        self.ack_statuses = True
        self.connections: list[FakeAgentConnection] = []
        self.invalid: list[str] = []  # frames that failed protocol validation
        self.acked: list[int] = []
        self._server: Server | None = None

    # -- server ---------------------------------------------------------------------------------------

    async def __aenter__(self) -> FakeOrchestrator:
        self._server = await serve(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        """`ws://127.0.0.1:PORT/ws`."""
        assert self._server is not None
        port = next(iter(self._server.sockets)).getsockname()[1]
        return f"ws://127.0.0.1:{port}/ws"

    async def _handle(self, ws: ServerConnection) -> None:
        connection = FakeAgentConnection(index=len(self.connections), ws=ws)
        self.connections.append(connection)
        try:
            auth = await self._receive(connection)
            if auth["type"] != "auth.request":
                await ws.close(p.CLOSE_BAD_MESSAGE, "expected auth.request")
                return
            if self.refuse_auth is not None:
                await self._send(ws, p.AuthFailure(reason=self.refuse_auth))
                await ws.close(p.CLOSE_AUTH_FAILED, self.refuse_auth)
                return
            early = await self._receive(connection) if self.auth_after_register else None
            await self._send(
                ws,
                p.AuthSuccess(
                    connection_id=new_id(),
                    instance_id="fake-orchestrator",
                    server_version="fake",
                    heartbeat_ms=self.heartbeat_ms,
                ),
            )
            register = early if early is not None else await self._receive(connection)
            if register["type"] != "agent.register":
                await ws.close(p.CLOSE_BAD_MESSAGE, "expected agent.register")
                return
            connection.register = register
            connection.registered_at = len(connection.messages)
            await self._send(
                ws,
                p.RegisterAck(
                    agent_id=register["agent_id"],
                    labels=register["labels"],
                    mandatory_labels=[],
                    pending_dispatch=False,
                ),
            )
            while True:
                message = await self._receive(connection)
                if message["type"] in ("step.finished", "job.finished") and self.ack_statuses:
                    await self.ack(message["oseq"], connection)
                elif message["type"] == "event.emit" and self.ack_statuses:
                    await self._send(
                        ws,
                        p.EventEmitResult(request_id=message["request_id"], event_id=new_id(), created=True),
                    )
                elif message["type"] == "heartbeat":
                    await self._send(ws, p.HeartbeatAck(ts=message.get("ts") or 0))
        except ConnectionClosed as closed:
            connection.closed_code = closed.rcvd.code if closed.rcvd is not None else None
        finally:
            connection.closed = True

    async def _receive(self, connection: FakeAgentConnection) -> dict[str, Any]:
        raw = await connection.ws.recv()
        try:
            p.parse_agent_message(raw)
        except Exception as error:  # the agent must only send valid protocol frames
            self.invalid.append(f"{raw!r}: {error}")
        message: dict[str, Any] = json.loads(raw)
        connection.messages.append(message)
        return message

    @staticmethod
    async def _send(ws: ServerConnection, message: p.Message) -> None:
        await ws.send(message.model_dump_json())

    # -- what tests drive -----------------------------------------------------------------------------

    @property
    def current(self) -> FakeAgentConnection:
        """The latest connection."""
        assert self.connections, "no agent connected"
        return self.connections[-1]

    def registered(self) -> FakeAgentConnection | None:
        """The latest connection if it finished the handshake and is open."""
        if self.connections and self.current.register is not None and not self.current.closed:
            return self.current
        return None

    def all_messages(self, kind: str) -> list[dict[str, Any]]:
        """Frames of one type over every connection."""
        return [message for connection in self.connections for message in connection.of_type(kind)]

    async def send(self, message: p.Message | dict[str, Any]) -> None:
        """Send a frame on the current connection."""
        raw = message.model_dump_json() if isinstance(message, p.Message) else json.dumps(message)
        await self.current.ws.send(raw)

    async def dispatch(self, document: dict[str, Any]) -> None:
        """Send a `job.dispatch` (validated first, as the real orchestrator's model would)."""
        await self.send(p.JobDispatch.model_validate(document))

    async def ack(self, oseq: int, connection: FakeAgentConnection | None = None) -> None:
        """`status.ack {oseq}`."""
        self.acked.append(oseq)
        await (connection or self.current).ws.send(p.StatusAck(oseq=oseq).model_dump_json())

    async def close(self, code: int, reason: str = "") -> None:
        """Close the current connection with `code`."""
        await self.current.ws.close(code, reason)

    def drop(self) -> None:
        """Drop the current connection without a close frame (a network failure)."""
        self.current.ws.transport.abort()


def job_dispatch(repo: Path, workflow: str = "ci", job: str = "build", **overrides: Any) -> dict[str, Any]:
    """A `job.dispatch` for `workflow`/`job` of the compiled repository at `repo` (cloned over file://)."""
    lock = load_lock(repo / ".conveyor" / "conveyor.lock.json")
    entry = lock.workflow(workflow)
    assert entry is not None, workflow
    job_entry = next(item for item in entry.jobs if item.name == job)
    sha = git(repo, "rev-parse", "HEAD")
    run_id = new_id()
    document: dict[str, Any] = {
        "type": "job.dispatch",
        "id": new_id(),
        "job_id": new_id(),
        "run_id": run_id,
        "attempt": 1,
        "repo": {
            "clone_url": repo.resolve().as_uri(),
            "ref": "refs/heads/main",
            "sha": sha,
            "auth_header": None,
        },
        "workflow": {
            "name": entry.name,
            "file": entry.source.file,
            "content_hash": entry.content_hash,
            "hashed_files": entry.hashed_files,
        },
        "job": {**job_entry.model_dump(mode="json", by_alias=True), "display_name": job},
        "env": {},
        "secrets": {},
        "upstream": {},
        "context": {
            "event": {"type": "push", "branch": "main", "ref": "refs/heads/main", "sha": sha},
            "run_id": run_id,
        },
    }
    document.update(overrides)
    return document
