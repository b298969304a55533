"""Direct downloads (docs/design/artifacts.md §4): with an S3 store, a job's whole download asked with
`?direct=1` is answered 307 with a presigned URL of the object store, which serves the blob without the
job's credential; the agent follows it, and falls back to the orchestrator's stream when the store cannot
be read from where it runs. The S3 store runs against moto's server, an S3 emulator."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from conveyor.agent.transfer import ArtifactClient
from tests.integration.artifacts.conftest import ENV, job_with_token, publish, service_of
from tests.support.inprocess import InProcessServer, in_process_server
from tests.support.processes import free_port
from tests.support.s3 import S3Emulator, s3_emulator

DATA = os.urandom(3 * 1024 * 1024 + 7)
SHA256 = hashlib.sha256(DATA).hexdigest()


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Emulator]:
    with s3_emulator(tmp_path_factory.mktemp("moto")) as emulator:
        yield emulator


@pytest.fixture(params=["direct", "direct-off"])
async def s3_server(
    request: pytest.FixtureRequest, s3: S3Emulator, database_url: str, tmp_path: Path
) -> AsyncIterator[InProcessServer]:
    env = {**ENV, **s3.env(s3.create_bucket())}
    if request.param == "direct-off":
        env["CONVEYOR_BLOB_DIRECT_DOWNLOADS"] = "false"
    async with in_process_server(database_url, tmp_path / "home", env=env) as found:
        yield found


class InProcessArtifactClient(ArtifactClient):
    """The agent's client, its orchestrator requests sent to the in-process app (its object store requests
    go over real sockets, as an agent's do)."""

    def __init__(self, server: InProcessServer, token: str, job_id: str, lines: list[str]) -> None:
        super().__init__("http://conveyor", token, job_id, direct_downloads=True, progress=lines.append)
        self._app = server.app

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self._app), base_url=self.base_url, headers=self._headers
        )


async def test_a_whole_download_asked_direct_is_sent_to_a_presigned_url_unless_turned_off(
    s3_server: InProcessServer,
) -> None:
    client = s3_server.client
    job = await job_with_token(s3_server)
    await publish(client, job, "dist", DATA)
    url = f"/api/v1/jobs/{job.job_id}/artifacts/dist/content"

    asked = await client.get(url, params={"direct": "1"}, headers=job.auth())
    if service_of(s3_server).direct_downloads:
        assert asked.status_code == 307 and asked.headers["x-conveyor-sha256"] == SHA256
        location = asked.headers["location"]
        assert "X-Amz-Signature=" in location
        fetched = httpx.get(location, timeout=30)  # no credential of Conveyor's
        assert fetched.status_code == 200 and fetched.content == DATA
    else:
        assert asked.status_code == 200 and asked.content == DATA
    # Not asked, or a range: the bytes come from the orchestrator.
    assert (await client.get(url, headers=job.auth())).content == DATA
    part = await client.get(url, params={"direct": "1"}, headers={**job.auth(), "Range": "bytes=5-9"})
    assert part.status_code == 206 and part.content == DATA[5:10]
    # The redirect is for a live credential of the run's jobs only.
    other = await job_with_token(s3_server)
    foreign = await client.get(url, params={"direct": "1"}, headers=other.auth())
    assert foreign.status_code == 403


async def test_the_agent_follows_the_redirect_and_falls_back_when_the_store_cannot_be_read(
    s3: S3Emulator, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with in_process_server(
        database_url, tmp_path / "home", env={**ENV, **s3.env(s3.create_bucket())}
    ) as server:
        job = await job_with_token(server)
        await publish(server.client, job, "dist", DATA, filename="dist.bin")
        lines: list[str] = []
        agent = InProcessArtifactClient(server, job.token, job.job_id, lines)

        found = await agent.download("dist", tmp_path / "first")
        assert await asyncio.to_thread(Path(found["path"]).read_bytes) == DATA
        assert lines == []  # fetched from the store: the emulator saw a presigned GET of the blob
        assert f"/blobs/sha256/{SHA256[:2]}/{SHA256}?X-Amz-Algorithm=" in s3.log_path.read_text()

        # A store the agent cannot reach (nothing listens at the URL it is sent to): the same bytes come
        # through the orchestrator, and the step's log says why.
        closed = f"http://127.0.0.1:{free_port()}/nowhere"

        async def unreachable(sha256: str) -> str:
            return closed

        monkeypatch.setattr(service_of(server), "direct_url", unreachable)
        found = await agent.download("dist", tmp_path / "second")
        assert await asyncio.to_thread(Path(found["path"]).read_bytes) == DATA
        assert len(lines) == 1 and "the object store could not be read" in lines[0]
