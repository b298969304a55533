"""The blob store on an S3-compatible object store, through obstore (docs/design/artifacts.md §2;
`docs/decisions.md`, "Artifacts (issue 38)").

A put streams into a multipart upload (obstore splits it into parts), hashing as it goes (in a worker
thread, each chunk while the next arrives). When the client announced the digest, the upload goes straight
to `sha256/<ab>/<digest>`, and the stream's end is withheld until the bytes are found to hash to it, so a
mismatch aborts the upload instead of completing it. Otherwise it goes to `staging/<uuid>`, and once the
stream ended whole a server-side copy places it at its digest's key and the staging key is deleted: a copy
costs as much as the upload again, and S3 copies at most 5 GiB in one call. A failed stream aborts the
multipart upload, so no partial object is ever visible.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterable, AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import obstore
from obstore.exceptions import BaseError as ObstoreError
from obstore.exceptions import NotFoundError
from obstore.store import S3Store

from conveyor.aio import WriteBehind
from conveyor.blobs.backend import (
    CHUNK_BYTES,
    BeforePlace,
    BlobCorrupt,
    BlobInfo,
    BlobMismatch,
    BlobNotFound,
    BlobStoreUnavailable,
    Hasher,
    StoredBlob,
    blob_key,
    bounded,
    digest_of_key,
)

# obstore raises the builtin FileNotFoundError for a missing key (its own NotFoundError in other paths).
_NOT_FOUND = (NotFoundError, FileNotFoundError)
# Multipart parts: S3 wants at least 5 MiB for every part but the last.
PART_BYTES = 8 * 1024 * 1024


class S3BlobStore:
    """Blobs as objects under `prefix` in one bucket."""

    def __init__(self, store: S3Store, description: str) -> None:
        self._store = store
        self.description = description
        self.prefers_digest_first = True
        self.signs_urls = True

    @classmethod
    def connect(
        cls,
        bucket: str,
        prefix: str,
        *,
        endpoint: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        allow_http: bool = False,
    ) -> S3BlobStore:
        """A store for `s3://bucket/prefix`; unset credentials come from the client's usual chain."""
        config: dict[str, Any] = {}
        if endpoint:
            config["endpoint"] = endpoint
            # Path-style requests: what S3-compatible servers other than AWS understand.
            config["virtual_hosted_style_request"] = False
        if region:
            config["region"] = region
        if access_key_id:
            config["access_key_id"] = access_key_id
        if secret_access_key:
            config["secret_access_key"] = secret_access_key
        store = S3Store(
            bucket,
            prefix=prefix or None,
            config=config,  # type: ignore[arg-type]
            client_options={"allow_http": allow_http, "connect_timeout": "10s", "timeout": "1h"},
        )
        where = f"s3://{bucket}/{prefix}".rstrip("/")
        return cls(store, where + (f" at {endpoint}" if endpoint else ""))

    async def put(
        self,
        chunks: AsyncIterable[bytes],
        *,
        max_bytes: int | None = None,
        before_place: BeforePlace | None = None,
        expected: str | None = None,
    ) -> BlobInfo:
        """Multipart-upload to the announced digest's key, or to a staging key and then copy it there."""
        hasher = Hasher()
        # A worker thread hashes each chunk while the client uploads it and the next one arrives.
        hashing = WriteBehind()

        async def counted() -> AsyncIterator[bytes]:
            try:
                async for chunk in bounded(chunks, max_bytes):
                    await hashing.submit(hasher.update, chunk)
                    yield chunk
                await hashing.drain()
            finally:
                await hashing.settle()
            if expected is not None:
                # Before the stream ends, which is when the client completes the upload at its final key.
                if hasher.hexdigest() != expected:
                    raise BlobMismatch(expected, hasher.hexdigest())
                if before_place is not None:
                    await before_place(BlobInfo(expected, hasher.size))

        target = blob_key(expected) if expected is not None else f"staging/{uuid.uuid4().hex}"
        try:
            await obstore.put_async(self._store, target, counted(), chunk_size=PART_BYTES, max_concurrency=4)
        except ObstoreError as error:
            raise BlobStoreUnavailable(f"storing a blob in {self.description} failed: {error}") from error
        if expected is not None:
            return BlobInfo(expected, hasher.size)
        sha256 = hasher.hexdigest()
        try:
            if before_place is not None:
                await before_place(BlobInfo(sha256, hasher.size))
            await obstore.copy_async(self._store, target, blob_key(sha256))
        except ObstoreError as error:
            raise BlobStoreUnavailable(
                f"placing blob {sha256} in {self.description} failed: {error}"
            ) from error
        finally:
            with contextlib.suppress(ObstoreError):
                await obstore.delete_async(self._store, target)
        return BlobInfo(sha256, hasher.size)

    async def get(self, sha256: str, *, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        """Stream an object (a range when asked); a whole read is checked against its digest."""
        whole = start == 0 and end is None
        if end is not None and end <= start:
            return
        options: dict[str, Any] = {}
        if not whole:
            options["range"] = {"offset": start} if end is None else (start, end)
        try:
            result = await obstore.get_async(self._store, blob_key(sha256), options=options or None)  # type: ignore[arg-type]
        except _NOT_FOUND:
            raise BlobNotFound(sha256) from None
        except ObstoreError as error:
            raise BlobStoreUnavailable(
                f"reading blob {sha256} from {self.description} failed: {error}"
            ) from error
        hasher = Hasher() if whole else None
        # A worker thread hashes each chunk while it is sent and the next one arrives.
        hashing = WriteBehind()
        try:
            async for piece in result.stream(min_chunk_size=CHUNK_BYTES):
                chunk = bytes(piece)
                if hasher is not None:
                    await hashing.submit(hasher.update, chunk)
                yield chunk
            await hashing.drain()
        finally:
            await hashing.settle()
        if hasher is not None and hasher.hexdigest() != sha256:
            raise BlobCorrupt(sha256, hasher.hexdigest())

    async def exists(self, sha256: str) -> BlobInfo | None:
        """HEAD the object."""
        try:
            meta = await obstore.head_async(self._store, blob_key(sha256))
        except _NOT_FOUND:
            return None
        except ObstoreError as error:
            raise BlobStoreUnavailable(
                f"looking up blob {sha256} in {self.description} failed: {error}"
            ) from error
        return BlobInfo(sha256, int(meta["size"]))

    async def signed_get_url(self, sha256: str, expires_in: timedelta) -> str | None:
        """A presigned GET of the object (SigV4, signed locally: no request to the store)."""
        try:
            return await obstore.sign_async(self._store, "GET", blob_key(sha256), expires_in)
        except ObstoreError as error:
            raise BlobStoreUnavailable(f"signing a URL for blob {sha256} failed: {error}") from error

    async def delete(self, sha256: str) -> None:
        """DELETE the object (S3 answers the same for an absent one)."""
        try:
            await obstore.delete_async(self._store, blob_key(sha256))
        except _NOT_FOUND:
            return
        except ObstoreError as error:
            raise BlobStoreUnavailable(
                f"deleting blob {sha256} from {self.description} failed: {error}"
            ) from error

    async def list_for_sweep(self) -> AsyncIterator[StoredBlob]:
        """List `sha256/`."""
        async for batch in obstore.list(self._store, "sha256/", chunk_size=1000):
            for meta in batch:
                sha256 = digest_of_key(meta["path"])
                if sha256 is not None:
                    yield StoredBlob(sha256, int(meta["size"]), meta["last_modified"])

    async def sweep_staging(self, older_than: datetime) -> int:
        """Delete staging objects last written before `older_than`."""
        stale: list[str] = []
        async for batch in obstore.list(self._store, "staging/", chunk_size=1000):
            stale.extend(meta["path"] for meta in batch if meta["last_modified"] < older_than)
        for path in stale:
            with contextlib.suppress(*_NOT_FOUND):
                await obstore.delete_async(self._store, path)
        return len(stale)

    async def check(self) -> None:
        """One listing call: the bucket exists and the credentials are good (boot check)."""
        try:
            async for _ in obstore.list(self._store, "sha256/", chunk_size=1):
                break
        except ObstoreError as error:
            raise BlobStoreUnavailable(
                f"the blob store {self.description} cannot be used: {error}"
            ) from error

    async def close(self) -> None:
        """obstore's client has nothing to close."""
