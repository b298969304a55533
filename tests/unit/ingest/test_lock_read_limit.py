"""Reading a streamed lock file under `lock_file_max_bytes`: nothing past the limit is held."""

from collections.abc import AsyncIterator

import pytest

from conveyor.ingest.providers.base import read_limited
from conveyor.lockfile import LockTooLarge, check_lock_size


class Chunks:
    """An async stream of chunks that records how many were pulled."""

    def __init__(self, chunk: bytes, count: int) -> None:
        self.chunk, self.count, self.pulled = chunk, count, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self.count):
            self.pulled += 1
            yield self.chunk


async def test_a_stream_within_the_limit_is_returned_whole() -> None:
    assert await read_limited(Chunks(b"x" * 10, 3).__aiter__(), 30) == b"x" * 30


async def test_reading_stops_at_the_first_chunk_past_the_limit() -> None:
    stream = Chunks(b"x" * 1024, 10_000)  # 10 MiB offered
    with pytest.raises(LockTooLarge, match="2048-byte limit"):
        await read_limited(stream.__aiter__(), 2048)
    assert stream.pulled == 3


async def test_a_declared_length_over_the_limit_refuses_before_reading() -> None:
    stream = Chunks(b"x", 1)
    with pytest.raises(LockTooLarge):
        await read_limited(stream.__aiter__(), 2048, declared=4096)
    assert stream.pulled == 0


def test_size_check_is_inclusive_of_the_limit() -> None:
    check_lock_size(1024, 1024)
    with pytest.raises(LockTooLarge, match="1025 bytes, over the 1024-byte limit"):
        check_lock_size(1025, 1024)
