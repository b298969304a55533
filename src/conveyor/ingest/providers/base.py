"""The provider interface (docs/design/execution.md §10) and the values it returns."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from conveyor.errors import ConveyorError
from conveyor.lockfile.errors import LockTooLarge
from conveyor.lockfile.reader import MAX_LOCK_BYTES, check_lock_size
from conveyor.matching import Event


class InvalidRequest(ConveyorError):
    """The delivery is malformed (400 `invalid_request`); the message names the header or field."""


class Retryable(ConveyorError):
    """A transient provider failure (5xx, 429, timeout, git error): retry later."""


class Permanent(ConveyorError):
    """A provider failure that retrying cannot fix."""


@dataclass(frozen=True)
class SourceRow:
    """The parts of a `sources` row providers use."""

    id: str
    org_id: str
    name: str
    kind: str
    routing_key: str
    repo: str
    api_url: str | None
    clone_url: str | None
    default_branch: str | None
    verify: str
    signature_header: str | None
    event_header: str | None
    report: str
    enabled: bool
    # docs/design/approvals.md §6: what a pull request from a fork gets.
    fork_pull_requests: str = "hold"


@dataclass(frozen=True)
class ParsedDelivery:
    """What the webhook route stores: the event name, action and delivery id, and the JSON payload."""

    event: str
    delivery_id: str
    action: str | None
    payload: dict[str, Any]


@dataclass(frozen=True)
class Ping:
    """A ping: answered `pong`, never stored."""


@dataclass(frozen=True)
class Ignored:
    """A delivery no trigger can use (the reason is stored)."""

    reason: str


@dataclass(frozen=True)
class Refused:
    """A delivery whose payload carries a value that must not reach git or a forge API (a commit id that
    is not one, a malformed ref): recorded `failed` with the reason, and never fetched or matched."""

    reason: str


@dataclass(frozen=True)
class StatusReport:
    """One commit status to send (docs/design/execution.md §10)."""

    sha: str
    context: str
    state: str
    description: str
    target_url: str | None
    external_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Markdown a check run's summary carries after the description (a job's test summary).
    details: str | None = None


class SourceProvider(Protocol):
    """What every source kind implements."""

    def normalise(
        self, source: SourceRow, delivery: ParsedDelivery, delivery_row_id: str
    ) -> Event | Ignored | Refused:
        """Turn a stored delivery into a matching event, or say why it is ignored or refused."""
        ...

    async def resolve_ref(self, source: SourceRow, ref: str) -> str | None:
        """The commit SHA a branch (or SHA) names; None when unknown. Raises `Retryable`."""
        ...

    async def fetch_lock(
        self, source: SourceRow, sha: str, *, max_bytes: int = MAX_LOCK_BYTES
    ) -> bytes | None:
        """The lock file's bytes at `sha`; None when the commit has none. Raises `Retryable`, and
        `LockTooLarge` for a lock over `max_bytes`, of which no more than `max_bytes` is read."""
        ...

    async def changed_files(self, source: SourceRow, event: Event) -> list[str] | None:
        """The files the event changed, None when unknown."""
        ...

    async def report(self, source: SourceRow, report: StatusReport) -> str | None:
        """Send a commit status; return an external id. Raises `Retryable` or `Permanent`."""
        ...


async def read_limited(chunks: AsyncIterator[bytes], max_bytes: int, declared: int | None = None) -> bytes:
    """Collect a streamed lock file, refusing (`LockTooLarge`) as soon as it passes `max_bytes`.

    A declared length over the limit refuses before anything is read; otherwise reading stops at
    the first chunk that crosses the limit, so a huge answer is never held in memory.
    """
    if declared is not None:
        check_lock_size(declared, max_bytes)
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise LockTooLarge(f"lock file is over the {max_bytes}-byte limit (lock_file_max_bytes)")
        parts.append(chunk)
    return b"".join(parts)
