"""The embedded blob store: files under a directory, `$CONVEYOR_HOME/blobs` by default
(docs/design/artifacts.md §2).

A put writes `staging/<uuid>` in blocks of about 1 MiB from a worker thread (hashing there too: hashlib releases
the GIL), fsyncs it and renames it to `sha256/<ab>/<digest>`: a rename is atomic, so a blob at its address
is always whole, and the same content put twice simply replaces itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterable, AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import BinaryIO

from conveyor.aio import read_ahead, write_hashed
from conveyor.blobs.backend import (
    CHUNK_BYTES,
    BeforePlace,
    BlobCorrupt,
    BlobInfo,
    BlobMismatch,
    BlobNotFound,
    Hasher,
    StoredBlob,
    blob_key,
    bounded,
    digest_of_key,
)


class FilesystemBlobStore:
    """Blobs as files under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.staging = root / "staging"
        self.description = f"file://{root}"
        self.prefers_digest_first = False
        self.signs_urls = False

    def path_of(self, sha256: str) -> Path:
        """The file that holds a blob."""
        return self.root / blob_key(sha256)

    async def put(
        self,
        chunks: AsyncIterable[bytes],
        *,
        max_bytes: int | None = None,
        before_place: BeforePlace | None = None,
        expected: str | None = None,
    ) -> BlobInfo:
        """Stream into a staging file, then rename it to its digest's path."""
        await asyncio.to_thread(self.staging.mkdir, parents=True, exist_ok=True)
        staging = self.staging / uuid.uuid4().hex
        hasher = Hasher()
        handle = await asyncio.to_thread(open, staging, "wb")
        try:
            # One block is written and hashed while the next one arrives.
            await write_hashed(bounded(chunks, max_bytes), handle, hasher, CHUNK_BYTES)
            await asyncio.to_thread(_flush, handle)
            handle.close()
            sha256 = hasher.hexdigest()
            if expected is not None and sha256 != expected:
                raise BlobMismatch(expected, sha256)
            if before_place is not None:
                await before_place(BlobInfo(sha256, hasher.size))
            final = self.path_of(sha256)
            await asyncio.to_thread(_publish, staging, final)
        except BaseException:
            handle.close()
            with contextlib.suppress(OSError):
                staging.unlink()
            raise
        return BlobInfo(sha256, hasher.size)

    async def get(self, sha256: str, *, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        """Stream a blob from its file; a whole read is checked against its digest."""
        path = self.path_of(sha256)
        try:
            handle = await asyncio.to_thread(open, path, "rb")
        except FileNotFoundError:
            raise BlobNotFound(sha256) from None
        whole = start == 0 and end is None
        hasher = Hasher() if whole else None
        remaining: list[int | None] = [None if end is None else max(0, end - start)]

        def read() -> bytes:
            left = remaining[0]
            if left is not None and left <= 0:
                return b""
            chunk = _read(handle, CHUNK_BYTES if left is None else min(CHUNK_BYTES, left), hasher)
            if left is not None:
                remaining[0] = left - len(chunk)
            return chunk

        try:
            if start:
                handle.seek(start)
            # The next block is read (and hashed) while this one is sent.
            async with contextlib.aclosing(read_ahead(read)) as blocks:
                async for chunk in blocks:
                    yield chunk
        finally:
            handle.close()
        if hasher is not None and hasher.hexdigest() != sha256:
            raise BlobCorrupt(sha256, hasher.hexdigest())

    async def exists(self, sha256: str) -> BlobInfo | None:
        """The blob's size from its file, or None."""
        try:
            stat = await asyncio.to_thread(self.path_of(sha256).stat)
        except FileNotFoundError:
            return None
        return BlobInfo(sha256, stat.st_size)

    async def signed_get_url(self, sha256: str, expires_in: timedelta) -> str | None:
        """Files have no URL a client could fetch on its own."""
        return None

    async def delete(self, sha256: str) -> None:
        """Unlink the blob's file."""
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(self.path_of(sha256).unlink)

    async def list_for_sweep(self) -> AsyncIterator[StoredBlob]:
        """Walk `sha256/`."""
        for found in await asyncio.to_thread(self._walk):
            yield found

    def _walk(self) -> list[StoredBlob]:
        found: list[StoredBlob] = []
        base = self.root / "sha256"
        if not base.is_dir():
            return found
        for directory in base.iterdir():
            if not directory.is_dir():
                continue
            for entry in directory.iterdir():
                sha256 = digest_of_key(f"sha256/{directory.name}/{entry.name}")
                if sha256 is None:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    stat = entry.stat()
                    found.append(StoredBlob(sha256, stat.st_size, datetime.fromtimestamp(stat.st_mtime, UTC)))
        return found

    async def sweep_staging(self, older_than: datetime) -> int:
        """Remove staging files last written before `older_than`."""
        return await asyncio.to_thread(self._sweep_staging, older_than.timestamp())

    def _sweep_staging(self, cutoff: float) -> int:
        removed = 0
        if not self.staging.is_dir():
            return 0
        for entry in self.staging.iterdir():
            with contextlib.suppress(FileNotFoundError):
                if entry.stat().st_mtime < cutoff:
                    entry.unlink()
                    removed += 1
        return removed

    async def close(self) -> None:
        """Nothing to release."""


def _flush(handle: BinaryIO) -> None:
    handle.flush()
    os.fsync(handle.fileno())


def _read(handle: BinaryIO, size: int, hasher: Hasher | None) -> bytes:
    chunk = handle.read(size)
    if hasher is not None and chunk:
        hasher.update(chunk)
    return chunk


def _publish(staging: Path, final: Path) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging, final)
    # The rename is durable once its directory is.
    descriptor = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
