"""Both blob stores behave alike (docs/design/artifacts.md §2): streamed in and out by SHA-256, placed
only once whole, checked on a whole read. The S3 store runs against moto's server, an S3 emulator."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest

from conveyor.blobs import BlobCorrupt, BlobInfo, BlobMismatch, BlobNotFound, BlobStore, BlobTooLarge
from conveyor.model.ids import utc_now


async def chunks_of(data: bytes, size: int = 256 * 1024) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def read_all(store: BlobStore, sha256: str, **kwargs: int) -> bytes:
    return b"".join([chunk async for chunk in store.get(sha256, **kwargs)])


async def listed(store: BlobStore) -> dict[str, int]:
    return {found.sha256: found.size async for found in store.list_for_sweep()}


async def test_a_put_streams_in_and_a_get_streams_the_same_bytes_back_by_their_sha256(
    blob_store: BlobStore,
) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)  # several chunks and multipart parts' worth, odd length
    info = await blob_store.put(chunks_of(data))
    assert info == BlobInfo(hashlib.sha256(data).hexdigest(), len(data))
    assert await read_all(blob_store, info.sha256) == data
    assert await blob_store.exists(info.sha256) == info
    assert await listed(blob_store) == {info.sha256: len(data)}
    # The same content again lands on the same address.
    assert await blob_store.put(chunks_of(data)) == info
    assert await listed(blob_store) == {info.sha256: len(data)}


async def test_a_range_read_serves_exactly_the_bytes_asked_for(blob_store: BlobStore) -> None:
    data = os.urandom(2 * 1024 * 1024 + 5)
    info = await blob_store.put(chunks_of(data))
    assert await read_all(blob_store, info.sha256, start=10, end=20) == data[10:20]
    assert await read_all(blob_store, info.sha256, start=len(data) - 3) == data[-3:]
    assert (
        await read_all(blob_store, info.sha256, start=1024 * 1024 - 1, end=1024 * 1024 + 1)
        == data[1024 * 1024 - 1 : 1024 * 1024 + 1]
    )


async def test_a_put_past_max_bytes_or_a_stream_that_fails_places_nothing_and_leaves_no_staging(
    blob_store: BlobStore,
) -> None:
    with pytest.raises(BlobTooLarge):
        await blob_store.put(chunks_of(os.urandom(100_000)), max_bytes=50_000)

    async def broken() -> AsyncIterator[bytes]:
        yield os.urandom(6 * 1024 * 1024)
        raise ConnectionResetError("the client went away")

    with pytest.raises(Exception) as raised:
        await blob_store.put(broken())
    assert "went away" in str(raised.value) or isinstance(raised.value, ConnectionResetError)
    assert await listed(blob_store) == {}
    # Nothing waits in staging either: a sweep from the far future removes nothing.
    assert await blob_store.sweep_staging(utc_now() + timedelta(days=1)) == 0


async def test_a_hook_that_refuses_before_placing_leaves_nothing(blob_store: BlobStore) -> None:
    async def refuse(info: BlobInfo) -> None:
        raise RuntimeError(f"not now: {info.sha256}")

    with pytest.raises(RuntimeError, match="not now"):
        await blob_store.put(chunks_of(b"payload" * 1000), before_place=refuse)
    assert await listed(blob_store) == {}
    assert await blob_store.sweep_staging(utc_now() + timedelta(days=1)) == 0


async def test_a_put_that_announces_its_digest_is_placed_only_after_the_hook_and_only_whole(
    blob_store: BlobStore,
) -> None:
    data = os.urandom(9 * 1024 * 1024 + 3)  # more than one multipart part
    sha256 = hashlib.sha256(data).hexdigest()
    seen_at_hook: list[BlobInfo | None] = []

    async def hook(info: BlobInfo) -> None:
        assert info == BlobInfo(sha256, len(data))
        seen_at_hook.append(await blob_store.exists(sha256))

    assert await blob_store.put(chunks_of(data), before_place=hook, expected=sha256) == BlobInfo(
        sha256, len(data)
    )
    assert seen_at_hook == [None]  # not visible at its address before the hook ran
    assert await read_all(blob_store, sha256) == data
    assert await listed(blob_store) == {sha256: len(data)}
    assert await blob_store.sweep_staging(utc_now() + timedelta(days=1)) == 0


async def test_bytes_that_do_not_hash_to_the_announced_digest_place_nothing_and_keep_the_blob_there(
    blob_store: BlobStore,
) -> None:
    kept = await blob_store.put(chunks_of(b"the real content" * 1000))
    other = os.urandom(6 * 1024 * 1024 + 1)
    hooked: list[BlobInfo] = []

    async def hook(info: BlobInfo) -> None:
        hooked.append(info)

    with pytest.raises(BlobMismatch) as raised:
        await blob_store.put(chunks_of(other), before_place=hook, expected=kept.sha256)
    assert raised.value.found == hashlib.sha256(other).hexdigest()
    assert hooked == []
    # The blob already at that address is untouched, and nothing else was stored.
    assert await read_all(blob_store, kept.sha256) == b"the real content" * 1000
    assert await listed(blob_store) == {kept.sha256: kept.size}
    absent = hashlib.sha256(b"never stored").hexdigest()
    with pytest.raises(BlobMismatch):
        await blob_store.put(chunks_of(b"abc"), expected=absent)
    with pytest.raises(BlobTooLarge):
        await blob_store.put(chunks_of(os.urandom(100_000)), max_bytes=50_000, expected=absent)
    assert await blob_store.exists(absent) is None
    assert await blob_store.sweep_staging(utc_now() + timedelta(days=1)) == 0


async def test_a_missing_blob_is_not_found_and_deleting_it_is_harmless(blob_store: BlobStore) -> None:
    absent = hashlib.sha256(b"never stored").hexdigest()
    with pytest.raises(BlobNotFound):
        await read_all(blob_store, absent)
    assert await blob_store.exists(absent) is None
    await blob_store.delete(absent)
    info = await blob_store.put(chunks_of(b"x" * 1000))
    await blob_store.delete(info.sha256)
    assert await blob_store.exists(info.sha256) is None


async def test_a_whole_read_of_bytes_that_no_longer_hash_to_their_address_fails_at_the_end(
    blob_store: BlobStore,
) -> None:
    good = await blob_store.put(chunks_of(b"a" * 5000))
    other = await blob_store.put(chunks_of(b"b" * 5000))
    # Swap the content under the first address (what a bad disk or a tampered bucket would do).
    await _overwrite(blob_store, good.sha256, b"c" * 5000)
    with pytest.raises(BlobCorrupt):
        await read_all(blob_store, good.sha256)
    assert await read_all(blob_store, other.sha256) == b"b" * 5000


async def _overwrite(store: BlobStore, sha256: str, data: bytes) -> None:
    from conveyor.blobs.backend import blob_key
    from conveyor.blobs.filesystem import FilesystemBlobStore
    from conveyor.blobs.s3 import S3BlobStore

    if isinstance(store, FilesystemBlobStore):
        store.path_of(sha256).write_bytes(data)
    else:
        import obstore

        assert isinstance(store, S3BlobStore)
        await obstore.put_async(store._store, blob_key(sha256), data)


async def test_an_object_stores_signed_url_serves_the_blob_without_credentials_and_files_have_none(
    blob_store: BlobStore,
) -> None:
    data = os.urandom(100_000)
    info = await blob_store.put(chunks_of(data))
    url = await blob_store.signed_get_url(info.sha256, timedelta(minutes=1))
    assert (url is not None) is blob_store.signs_urls
    if url is not None:
        async with httpx.AsyncClient() as bare:
            fetched = await bare.get(url)
        assert fetched.status_code == 200 and fetched.content == data
