"""Job logs, the service (docs/design/execution.md §9): appends that wake readers, live follow, the LISTEN
fan-out.

Published at start-up as `LOGS` (a `LogService`). The agent endpoint calls
`LogService.append(chunk, secrets)`; log routes call `follow(...)` for server-sent events.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from conveyor.db.channels import LOGS_CHANNEL
from conveyor.db.engine import Database
from conveyor.db.listen import NotificationListener
from conveyor.execution import log_store
from conveyor.execution.log_store import AppendResult
from conveyor.execution.logs import (
    DispatchAttempt,
    HeaderItem,
    LogSignals,
    fallback_step_name,
    named_attempt,
    sse_frame,
    sse_line,
)
from conveyor.http.deps import AuthorisationCheck
from conveyor.model.protocol import LogChunk
from conveyor.model.states import JOB_TERMINAL
from conveyor.parts import PartKey
from conveyor.runtime.node import Component, Node, NodeSettings

# The last event of a stream whose caller lost its access while it followed.
DENIED = {"error": "invalid_token", "detail": "the token was revoked or expired, or the session ended"}
logger = logging.getLogger(__name__)


@dataclass
class LogService:
    """Appends chunks and serves live follow; `signals` wakes this process's readers."""

    db: Database
    signals: LogSignals = field(default_factory=LogSignals)
    keepalive_s: float = 15.0
    poll_s: float = 1.0

    async def append(self, chunk: LogChunk, secrets: Sequence[str] = ()) -> AppendResult:
        """Store one `log.chunk` in its own transaction, then wake this process's readers."""
        async with self.db.transaction() as conn:
            result = await log_store.append_chunk(
                conn,
                job_id=chunk.job_id,
                step_index=chunk.step_index,
                seq=chunk.seq,
                lines=chunk.lines,
                attempt=named_attempt(chunk.attempt),
                secrets=secrets,
            )
        if result.stored:
            self.signals.wake(chunk.job_id)
        return result

    def job_changed(self, job_id: str) -> None:
        """Call after committing a job or step status change, so followers see it without polling."""
        self.signals.wake(job_id)

    async def follow(
        self,
        job_id: str,
        *,
        step: int | None,
        offset: int,
        authorised: AuthorisationCheck | None = None,
    ) -> AsyncIterator[str]:
        """Server-sent events of the log from `offset` until the job is terminal and fully sent.

        `log` per line (id = offset just past it), `step` at each step header of the job view and when a
        step's status changes, `attempt {attempt, hop}` when another execution's log becomes the job's (its
        lines follow from offset 0), a comment every `keepalive_s` of silence, `end {status}` last. The
        caller is re-checked with `authorised` at most every `poll_s`: a stream whose token was
        revoked (or expired, or whose dashboard session ended) ends with `denied {error, detail}`.
        """
        sent_steps: dict[int, tuple[str, str]] = {}
        followed: DispatchAttempt | None = None  # the execution whose log is being sent
        last_write = last_check = time.monotonic()
        while True:
            if authorised is not None and time.monotonic() - last_check >= self.poll_s:
                last_check = time.monotonic()
                if not await authorised():
                    yield sse_frame("denied", DENIED)
                    return
            seen = self.signals.version(job_id)
            async with self.db.read() as conn:
                status = await log_store.log_status(conn, job_id, step)
                if status is None:
                    return
                frames: list[str] = []
                if followed is not None and status.attempt != followed:
                    # Another attempt's log is now the job's (it ran again, or the one that counts was an
                    # earlier one): say so, and send that log from its start.
                    shown = status.attempt
                    frames.append(sse_frame("attempt", {"attempt": shown.attempt, "hop": shown.hop}))
                    offset = 0
                    sent_steps.clear()
                followed = status.attempt
                items = await log_store.read_items(
                    conn, job_id, step=step, offset=offset, attempt=status.attempt
                )
                states = await log_store.step_states(conn, job_id)
            for item in items:
                if isinstance(item, HeaderItem):
                    name, step_status = states.get(item.step_index, (fallback_step_name(item.step_index), ""))
                    frames.append(
                        sse_frame(
                            "step",
                            {"step_index": item.step_index, "name": name, "status": step_status or None},
                            item.end,
                        )
                    )
                    sent_steps[item.step_index] = (name, step_status)
                else:
                    frames.append(sse_line(item, offset))
                offset = item.end
            for index, (name, step_status) in sorted(states.items()):
                if step is not None and index != step:
                    continue
                if sent_steps.get(index) != (name, step_status):
                    sent_steps[index] = (name, step_status)
                    frames.append(
                        sse_frame("step", {"step_index": index, "name": name, "status": step_status})
                    )
            if frames:
                yield "".join(frames)
                last_write = time.monotonic()
                if items:
                    continue  # there may be more than one read's worth
            if status.job_status in JOB_TERMINAL:
                # Status was read before the lines, so everything stored before the end is sent.
                yield sse_frame("end", {"status": status.job_status})
                return
            idle = time.monotonic() - last_write
            if idle >= self.keepalive_s:
                yield ": keep-alive\n\n"
                last_write = time.monotonic()
                idle = 0.0
            await self.signals.wait(job_id, seen, min(self.poll_s, self.keepalive_s - idle))


class LogSettings(NodeSettings, Protocol):
    """What the log service reads of the node's configuration."""

    log_keepalive_ms: int
    log_poll_ms: int


class LogNode(Node, Protocol):
    """The node as the log service sees it."""

    @property
    def settings(self) -> LogSettings: ...


def log_service(state: LogNode) -> LogService:
    """The published `LogService` (one made on demand where the start-up hook did not run)."""
    service = state.parts.get(LOGS)
    if service is None:
        service = LogService(
            state.db,
            keepalive_s=state.settings.log_keepalive_ms / 1000,
            poll_s=state.settings.log_poll_ms / 1000,
        )
        state.parts.put(LOGS, service)
    return service


async def start(state: LogNode) -> Sequence[Component]:
    """Start-up hook: publish the `LogService`; on PostgreSQL, start the LISTEN fan-out."""
    service = log_service(state)
    if state.db.dialect != "postgresql":
        return []
    # NOTIFY is a hint: readers also poll, and a reconnect wakes every reader.
    listener = NotificationListener(
        state.db.url,
        {LOGS_CHANNEL: service.signals.wake},
        name="log-listener",
        on_connect=service.signals.wake_all,
    )
    await listener.start()
    return [listener]


LOGS = PartKey[LogService]("logs")
