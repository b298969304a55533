"""Blob stores for the tests: the filesystem store in the test's directory, and the S3 store against
moto's server (an S3 emulator, `tests/support/s3.py`), one emulator per module."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from conveyor.blobs import BlobStore, S3Options, open_blob_store
from conveyor.blobs.location import FileLocation, S3Location
from tests.support.s3 import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY, S3Emulator, s3_emulator


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Emulator]:
    with s3_emulator(tmp_path_factory.mktemp("moto")) as emulator:
        yield emulator


def s3_store(emulator: S3Emulator, prefix: str = "blobs") -> BlobStore:
    """An S3 blob store on a new bucket of the emulator."""
    bucket = emulator.create_bucket()
    return open_blob_store(
        S3Location(bucket, prefix),
        S3Options(
            endpoint=emulator.endpoint,
            region=REGION,
            access_key_id=ACCESS_KEY_ID,
            secret_access_key=SECRET_ACCESS_KEY,
            allow_http=True,
        ),
    )


@pytest.fixture(params=["filesystem", "s3"])
async def blob_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BlobStore]:
    if request.param == "filesystem":
        store = open_blob_store(FileLocation(tmp_path / "blobs"))
    else:
        store = s3_store(request.getfixturevalue("s3"))
    yield store
    await store.close()
