"""What every blob store offers (docs/design/artifacts.md §2): content addressed by SHA-256, streamed both
ways, a blob visible at its address only once it is stored whole."""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from conveyor.errors import ConveyorError

# One chunk of a stream: what is held in memory at a time.
CHUNK_BYTES = 1024 * 1024
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class BlobError(ConveyorError):
    """Base of the blob store's errors."""


class BlobNotFound(BlobError):
    """No blob has this digest."""

    def __init__(self, sha256: str) -> None:
        super().__init__(f"no blob {sha256}")
        self.sha256 = sha256


class BlobTooLarge(BlobError):
    """A put passed its `max_bytes`; nothing was stored."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"the blob is larger than {max_bytes} bytes")
        self.max_bytes = max_bytes


class BlobCorrupt(BlobError):
    """What was read does not hash to the blob's address."""

    def __init__(self, sha256: str, found: str) -> None:
        super().__init__(f"blob {sha256} reads back as {found}")
        self.sha256 = sha256
        self.found = found


class BlobMismatch(BlobError):
    """A put's bytes do not hash to the digest its client announced; nothing was stored."""

    def __init__(self, expected: str, found: str) -> None:
        super().__init__(f"the bytes hash to {found}, not to the announced {expected}")
        self.expected = expected
        self.found = found


class BlobStoreUnavailable(BlobError):
    """The store could not be reached or refused the request."""


@dataclass(frozen=True)
class BlobInfo:
    """A stored blob: its digest and size in bytes."""

    sha256: str
    size: int


@dataclass(frozen=True)
class StoredBlob:
    """A blob as the sweep lists it."""

    sha256: str
    size: int
    modified_at: datetime


BeforePlace = Callable[[BlobInfo], Awaitable[None]]


class BlobStore(Protocol):
    """A content-addressed store of byte streams."""

    description: str
    # Whether a put costs less when its digest is announced (`expected`): an object store then writes the
    # digest's key directly instead of a staging object and a copy; a file store gains nothing.
    prefers_digest_first: bool
    # Whether `signed_get_url` gives URLs (an object store) or always None (files).
    signs_urls: bool

    async def put(
        self,
        chunks: AsyncIterable[bytes],
        *,
        max_bytes: int | None = None,
        before_place: BeforePlace | None = None,
        expected: str | None = None,
    ) -> BlobInfo:
        """Store a stream; the blob is at its address only once the stream ended whole.

        `before_place` runs once the digest is known and before the blob is placed at its address (the
        `blobs` row is marked live there). Raises `BlobTooLarge` past `max_bytes`, and `BlobMismatch` when
        `expected` (a digest the client announced) is not what the bytes hash to; whatever the chunks or
        the hook raise propagates, and then nothing is placed.
        """
        ...

    def get(self, sha256: str, *, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        """Stream bytes `[start, end)` of a blob (`end` None = to its end).

        A whole read raises `BlobCorrupt` after the last chunk when the bytes do not hash to `sha256`;
        `BlobNotFound` when it is absent.
        """
        ...

    async def exists(self, sha256: str) -> BlobInfo | None:
        """The blob's size, or None when it is absent."""
        ...

    async def signed_get_url(self, sha256: str, expires_in: timedelta) -> str | None:
        """A URL that serves the whole blob without credentials until `expires_in` passed, for a client
        that may reach the store itself; None when the store has no such URLs (a file store)."""
        ...

    async def delete(self, sha256: str) -> None:
        """Remove a blob (an absent one is not an error)."""
        ...

    def list_for_sweep(self) -> AsyncIterator[StoredBlob]:
        """Every stored blob, in no particular order."""
        ...

    async def sweep_staging(self, older_than: datetime) -> int:
        """Remove what interrupted puts left before `older_than`; how many were removed."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


def check_digest(sha256: str) -> str:
    """`sha256` if it is 64 lower-case hex digits, else ValueError (a digest names a path or key)."""
    if not SHA256_RE.match(sha256):
        raise ValueError(f"not a SHA-256 digest: {sha256[:80]!r}")
    return sha256


def blob_key(sha256: str) -> str:
    """Where a blob lives under the store's root: `sha256/<first two>/<digest>`."""
    check_digest(sha256)
    return f"sha256/{sha256[:2]}/{sha256}"


def digest_of_key(key: str) -> str | None:
    """The digest a key names, or None for anything that is not a blob's key."""
    parts = key.rsplit("/", 3)
    if len(parts) < 3 or parts[-3] != "sha256" or not SHA256_RE.match(parts[-1]):
        return None
    if parts[-2] != parts[-1][:2]:
        return None
    return parts[-1]


async def bounded(chunks: AsyncIterable[bytes], max_bytes: int | None) -> AsyncIterator[bytes]:
    """`chunks` as they come, raising `BlobTooLarge` once they pass `max_bytes` (None: no bound)."""
    received = 0
    async for chunk in chunks:
        received += len(chunk)
        if max_bytes is not None and received > max_bytes:
            raise BlobTooLarge(max_bytes)
        yield chunk


class Hasher:
    """SHA-256 and length of a stream, fed chunk by chunk."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.size = 0

    def update(self, chunk: bytes) -> None:
        """Add one chunk."""
        self._hash.update(chunk)
        self.size += len(chunk)

    def hexdigest(self) -> str:
        """The digest so far."""
        return self._hash.hexdigest()
