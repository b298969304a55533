"""A SCRIPTED protocol client: speaks the real agent protocol over a real socket, without running jobs.

Tests drive it step by step (ack or not, start, finish, disconnect, reconnect) to check the
orchestrator's side of docs/design/execution.md §6 without waiting for the real agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from typing import Any

import websockets

from conveyor.model import protocol as p
from conveyor.model.ids import new_id
from tests.support.waiting import async_wait_until


class ScriptedAgent:
    """One scripted agent connection."""

    def __init__(
        self,
        ws_url: str,
        token: str,
        *,
        agent_id: str | None = None,
        labels: list[str] | None = None,
        capacity: int = 1,
        heartbeat_s: float | None = None,
        ephemeral: bool = False,
    ) -> None:
        self.ws_url = ws_url
        # Heartbeats every `heartbeat_s` keep a long-lived scripted agent from being closed 4004.
        self.heartbeat_s = heartbeat_s
        self._heartbeat: asyncio.Task[None] | None = None
        self.running: set[str] = set()
        self.token = token
        self.agent_id = agent_id or f"scripted-{new_id()[-8:]}"
        self.labels = labels or ["linux"]
        self.capacity = capacity
        # `agent.register`'s `ephemeral` (what `conveyor agent --ephemeral` sends).
        self.ephemeral = ephemeral
        self.socket: Any = None
        self.inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.received: list[Any] = []
        self.close_code: int | None = None
        self._reader: asyncio.Task[None] | None = None
        self._oseq = itertools.count(1)
        self.acked: set[int] = set()

    async def connect(
        self, *, in_flight: list[str] | None = None, unacked: list[str] | None = None
    ) -> p.RegisterAck:
        """Authenticate and register; returns the `register.ack`."""
        self.socket = await websockets.connect(self.ws_url, max_size=None)
        await self.socket.send(p.AuthRequest(token=self.token, version="scripted").model_dump_json())
        auth = p.parse_orchestrator_message(await self.socket.recv())
        if not isinstance(auth, p.AuthSuccess):
            raise PermissionError(f"auth refused: {auth}")
        register = p.AgentRegister(
            agent_id=self.agent_id,
            labels=self.labels,
            capacity=self.capacity,
            in_flight=[p.InFlight(job_id=j) for j in in_flight or []],
            unacked_jobs=unacked or [],
            ephemeral=self.ephemeral,
        )
        await self.socket.send(register.model_dump_json())
        ack = p.parse_orchestrator_message(await self.socket.recv())
        assert isinstance(ack, p.RegisterAck), ack
        self._reader = asyncio.create_task(self._read())
        if self.heartbeat_s is not None:
            self._heartbeat = asyncio.create_task(self._beat(self.heartbeat_s))
        return ack

    async def connect_refused(self, *, in_flight: list[str] | None = None) -> tuple[Any, int | None]:
        """Authenticate and register expecting a refusal; returns the answer and the close code."""
        socket = await websockets.connect(self.ws_url, max_size=None)
        try:
            await socket.send(p.AuthRequest(token=self.token, version="scripted").model_dump_json())
            answer = p.parse_orchestrator_message(await socket.recv())
            if isinstance(answer, p.AuthSuccess):
                register = p.AgentRegister(
                    agent_id=self.agent_id,
                    labels=self.labels,
                    capacity=self.capacity,
                    in_flight=[p.InFlight(job_id=j) for j in in_flight or []],
                )
                await socket.send(register.model_dump_json())
                answer = p.parse_orchestrator_message(await socket.recv())
            with contextlib.suppress(websockets.ConnectionClosed):
                await socket.recv()
            return answer, socket.close_code
        finally:
            await socket.close()

    async def _beat(self, interval_s: float) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            while True:
                await self.send(
                    p.Heartbeat(ts=time.time(), running=sorted(self.running), free_slots=self.capacity)
                )
                await asyncio.sleep(interval_s)

    async def _read(self) -> None:
        try:
            async for raw in self.socket:
                message = p.parse_orchestrator_message(raw)
                self.received.append(message)
                if isinstance(message, p.StatusAck):
                    self.acked.add(message.oseq)
                await self.inbox.put(message)
        except websockets.ConnectionClosed as exc:
            self.close_code = exc.rcvd.code if exc.rcvd else None
        finally:
            if self.close_code is None and self.socket.close_code is not None:
                self.close_code = self.socket.close_code

    async def next_of(self, kind: type[Any], timeout: float = 60) -> Any:
        """The next message of a type (others are kept in `received`)."""
        async with asyncio.timeout(timeout):
            while True:
                message = await self.inbox.get()
                if isinstance(message, kind):
                    return message

    async def send(self, message: p.Message) -> None:
        """Send one frame."""
        await self.socket.send(message.model_dump_json())

    async def send_raw(self, document: dict[str, Any]) -> None:
        """Send an arbitrary JSON frame (for protocol-error tests)."""
        await self.socket.send(json.dumps(document))

    async def accept(self, dispatch: p.JobDispatch) -> None:
        """Ack and start a dispatched job."""
        await self.send(p.JobAck(re=dispatch.id, job_id=dispatch.job_id))
        await self.send(p.JobStarted(job_id=dispatch.job_id))
        self.running.add(dispatch.job_id)

    async def step(
        self, job_id: str, index: int, name: str, status: str = "success", lines: list[str] | None = None
    ) -> int:
        """Report one step with its log lines; returns its oseq."""
        await self.send(p.StepStarted(job_id=job_id, step_index=index, name=name))
        if lines:
            await self.send(
                p.LogChunk(job_id=job_id, step_index=index, seq=0, lines=[p.LogLine(text=t) for t in lines])
            )
        oseq = next(self._oseq)
        await self.send(p.StepFinished(oseq=oseq, job_id=job_id, step_index=index, name=name, status=status))  # type: ignore[arg-type]
        return oseq

    async def finish(
        self, job_id: str, status: str = "success", reason: str | None = None, oseq: int | None = None
    ) -> int:
        """Report the job's end; returns its oseq."""
        oseq = oseq or next(self._oseq)
        self.running.discard(job_id)
        await self.send(p.JobFinished(oseq=oseq, job_id=job_id, status=status, reason=reason))  # type: ignore[arg-type]
        return oseq

    async def wait_acked(self, oseq: int, timeout: float = 60) -> None:
        """Until the orchestrator acknowledged `oseq`."""

        async def acked() -> bool:
            return oseq in self.acked

        await async_wait_until(acked, timeout=timeout, what=f"status.ack for oseq {oseq}")

    async def wait_closed(self, timeout: float = 60) -> int | None:
        """Until the orchestrator closed the socket; the close code."""
        assert self._reader is not None
        async with asyncio.timeout(timeout):
            await self._reader
        return self.close_code

    async def close(self) -> None:
        """Close from our side."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
        if self.socket is not None:
            await self.socket.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
