"""The blob sweep (docs/design/artifacts.md §2): a blob some artifact references stays, an unreferenced one
past the grace goes with its row, a put that made a doomed blob live again wins, and a stored blob the
database does not know goes too."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from datetime import timedelta

from sqlalchemy import insert, select

from conveyor.blobs import BlobInfo, BlobStore, BlobSweep
from conveyor.blobs import store as blob_rows
from conveyor.db.engine import Database
from conveyor.db.tables import DEFAULT_ORG, artifacts, blobs
from conveyor.model.ids import new_id, utc_now

GRACE = timedelta(minutes=10)


async def one(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def put_live(db: Database, store: BlobStore, data: bytes) -> BlobInfo:
    async def mark(info: BlobInfo) -> None:
        async with db.transaction() as conn:
            await blob_rows.mark_live(conn, info.sha256, info.size, utc_now())

    return await store.put(one(data), before_place=mark)


async def reference(db: Database, sha256: str, size: int) -> None:
    async with db.transaction() as conn:
        await conn.execute(
            insert(artifacts).values(
                id=new_id(),
                org_id=DEFAULT_ORG,
                run_id=new_id(),
                job_id=new_id(),
                name="dist",
                format="file",
                filename="dist.bin",
                size=size,
                blob_sha256=sha256,
                file_count=1,
                created_at=utc_now(),
            )
        )


def sweeper(db: Database, store: BlobStore) -> BlobSweep:
    return BlobSweep(db, store, references=[artifacts.c.blob_sha256], grace=GRACE)


async def rows(db: Database) -> dict[str, str]:
    async with db.read() as conn:
        return {row.sha256: row.state for row in await conn.execute(select(blobs.c.sha256, blobs.c.state))}


async def test_only_unreferenced_blobs_past_the_grace_are_deleted_with_their_rows(
    database: Database, blob_store: BlobStore
) -> None:
    kept = await put_live(database, blob_store, b"referenced")
    await reference(database, kept.sha256, kept.size)
    dropped = await put_live(database, blob_store, b"nobody wants me")

    young = await sweeper(database, blob_store).sweep(utc_now())
    assert young["unreferenced"] == 0
    assert await blob_store.exists(dropped.sha256) is not None

    later = utc_now() + GRACE + timedelta(seconds=1)
    totals = await sweeper(database, blob_store).sweep(later)
    assert totals["unreferenced"] == 1
    assert await blob_store.exists(dropped.sha256) is None
    assert await blob_store.exists(kept.sha256) is not None
    assert await rows(database) == {kept.sha256: "live"}


async def test_a_put_that_makes_a_doomed_blob_live_again_keeps_it(
    database: Database, tmp_path: object
) -> None:
    from pathlib import Path

    from conveyor.blobs.filesystem import FilesystemBlobStore

    store = FilesystemBlobStore(Path(str(tmp_path)) / "blobs")
    info = await put_live(database, store, b"wanted again")
    later = utc_now() + GRACE + timedelta(seconds=1)
    async with database.transaction() as conn:
        assert await blob_rows.doom_unreferenced(conn, [artifacts.c.blob_sha256], later, 10) == 1
    # An upload of the same content ends before the sweep gets to its delete.
    await put_live(database, store, b"wanted again")
    totals = await sweeper(database, store).sweep(utc_now())
    assert totals["unreferenced"] == 0
    assert await store.exists(info.sha256) is not None
    assert await rows(database) == {info.sha256: "live"}


async def test_a_stored_blob_with_no_row_is_deleted_after_the_grace(
    database: Database, blob_store: BlobStore
) -> None:
    orphan = await blob_store.put(one(b"left by a crash"))
    known = await put_live(database, blob_store, b"has a row")
    await reference(database, known.sha256, known.size)
    assert (await sweeper(database, blob_store).sweep(utc_now()))["orphan"] == 0
    totals = await sweeper(database, blob_store).sweep(utc_now() + GRACE + timedelta(minutes=1))
    assert totals["orphan"] == 1
    assert await blob_store.exists(orphan.sha256) is None
    assert await blob_store.exists(known.sha256) is not None
    assert orphan.sha256 == hashlib.sha256(b"left by a crash").hexdigest()


async def test_claiming_an_orphan_that_has_a_row_reports_false_on_both_databases(database: Database) -> None:
    # PostgreSQL's driver reported a skipped ON CONFLICT insert as a changed row, so the sweep took a live
    # blob whose row appeared after its listing for an orphan of its own making.
    digest = hashlib.sha256(b"live").hexdigest()
    async with database.transaction() as conn:
        await blob_rows.mark_live(conn, digest, 4, utc_now())
    async with database.transaction() as conn:
        assert await blob_rows.claim_orphan(conn, digest, 4, utc_now()) is False
    assert await rows(database) == {digest: "live"}
    other = hashlib.sha256(b"orphan").hexdigest()
    async with database.transaction() as conn:
        assert await blob_rows.claim_orphan(conn, other, 6, utc_now()) is True
    assert (await rows(database))[other] == "doomed"
