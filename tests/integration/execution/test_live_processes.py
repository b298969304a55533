"""Live logs against a real `conveyor server`: SSE delivers lines while the job runs, and
`conveyor admin run logs --follow` prints them as they arrive. Chunks are appended by this test
straight into the shared database, so the server sees them as it would an agent's from a peer
(PostgreSQL: LISTEN/NOTIFY; SQLite: the 1 s poll)."""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from conveyor.db.engine import Database
from tests.integration.execution.conftest import RunningJob, append, finish_job, insert_job
from tests.support.follow import start_follow
from tests.support.processes import ServerProcess, run_cli

pytestmark = pytest.mark.slow


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    running = ServerProcess(tmp_path / "home", database_url=database_url)
    try:
        running.wait_ready(timeout=90)
        yield running
    finally:
        running.stop()


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    opened = Database.connect(database_url, pool_size=2)
    try:
        yield opened
    finally:
        await opened.dispose()


async def next_event(lines: AsyncIterator[str]) -> tuple[str, dict[str, object]]:
    """The next `event`/`data` pair of an SSE stream (comments and ids skipped)."""
    event = None
    async for line in lines:
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: ") and event is not None:
            return event, json.loads(line.removeprefix("data: "))
    raise AssertionError("the stream closed")


async def next_of_kind(lines: AsyncIterator[str], kind: str) -> dict[str, object]:
    """The data of the next event of `kind`, the others (`step`, `attempt`, `log`) skipped."""
    while True:
        event, data = await next_event(lines)
        if event == kind:
            return data


async def next_log(lines: AsyncIterator[str]) -> dict[str, object]:
    return await asyncio.wait_for(next_of_kind(lines, "log"), timeout=15)


async def test_sse_delivers_lines_while_the_job_runs_and_ends_with_end(
    server: ServerProcess, db: Database
) -> None:
    job = await insert_job(db, step_names={1: "build"})
    path = f"/api/v1/admin/runs/{job.run_id}/jobs/{job.job_id}/logs/stream"
    headers = {"Authorization": f"Bearer {server.owner_token()}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as client:
        async with client.stream("GET", path, params={"step": 1}) as response:
            assert response.status_code == 200
            lines = response.aiter_lines()
            await append(db, job.job_id, 1, 0, ["compiling"])
            assert (await next_log(lines))["text"] == "compiling"
            await append(db, job.job_id, 1, 1, ["linking", "done"])
            assert [(await next_log(lines))["text"] for _ in range(2)] == ["linking", "done"]
            # Still running: the stream stays open until the job is terminal.
            await finish_job(db, job.job_id)
            while True:
                event, data = await asyncio.wait_for(next_event(lines), timeout=15)
                if event == "end":
                    break
            assert data == {"status": "success"}
            assert [line async for line in lines if line.startswith("event:")] == []


async def test_open_streams_end_when_their_token_is_revoked_bearer_and_dashboard_cookie(
    server: ServerProcess, db: Database
) -> None:
    job = await insert_job(db, step_names={1: "build"})
    path = f"/api/v1/admin/runs/{job.run_id}/jobs/{job.job_id}/logs/stream"
    owner = {"Authorization": f"Bearer {server.owner_token()}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as admin:
        minted = await admin.post("/api/v1/admin/tokens", json={"role": "operator"}, headers=owner)
        assert minted.status_code == 201, minted.text
        token, token_id = minted.json()["token"], minted.json()["id"]
    async with (
        httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        ) as cli,
        httpx.AsyncClient(base_url=server.url, timeout=30) as browser,
    ):
        signed_in = await browser.post("/ui/sign-in", data={"token": token})
        assert signed_in.status_code == 303, signed_in.text
        async with (
            cli.stream("GET", path, params={"step": 1}) as by_token,
            browser.stream("GET", path, params={"step": 1}) as by_cookie,
        ):
            assert (by_token.status_code, by_cookie.status_code) == (200, 200)
            streams = [by_token.aiter_lines(), by_cookie.aiter_lines()]
            await append(db, job.job_id, 1, 0, ["before the revocation"])
            for lines in streams:
                assert (await next_log(lines))["text"] == "before the revocation"
            revoked = await admin_delete(server, f"/api/v1/admin/tokens/{token_id}", owner)
            assert revoked.status_code == 204, revoked.text
            for lines in streams:
                # A `step` frame may still come first: when the line was appended before the stream's
                # first read, that read sends the line, then the step's state, in one batch.
                data = await asyncio.wait_for(next_of_kind(lines, "denied"), timeout=15)
                assert data["error"] == "invalid_token"
                # ...and the server ends the stream: no more lines, although the job still runs.
                rest = await asyncio.wait_for(_drain(lines), timeout=15)
                assert [line for line in rest if line.startswith(("event:", "data:"))] == []


async def _drain(lines: AsyncIterator[str]) -> list[str]:
    return [line async for line in lines]


async def admin_delete(server: ServerProcess, path: str, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        return await client.delete(path, headers=headers)


class LineReader:
    """Collects a subprocess's stdout lines on a thread, so the test can wait for each one."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout
        threading.Thread(target=lambda: [self.lines.put(line) for line in stdout], daemon=True).start()

    def expect(self, text: str, timeout: float = 30) -> None:
        """Until a line equal to `text` (without its newline) arrives."""
        seen = []
        while True:
            try:
                line = self.lines.get(timeout=timeout).rstrip("\n")
            except queue.Empty:
                raise AssertionError(f"no line {text!r} after {timeout}s; saw {seen}") from None
            if line == text:
                return
            seen.append(line)


async def test_run_logs_follow_prints_lines_while_the_job_runs(server: ServerProcess, db: Database) -> None:
    job = await insert_job(db, step_names={0: "setup", 1: "build"})
    await append(db, job.job_id, 0, 0, ["checked out"], stream="sys")
    env = {"CONVEYOR_URL": server.url, "CONVEYOR_TOKEN": server.owner_token()}
    proc = start_follow(env, job.run_id)
    try:
        reader = LineReader(proc)
        # The first line waits for the CLI process to start (slow on a loaded machine).
        await asyncio.to_thread(reader.expect, "── 0 setup ──", 90)
        await asyncio.to_thread(reader.expect, "[conveyor] checked out")
        await append(db, job.job_id, 1, 0, ["step output 1"])
        await asyncio.to_thread(reader.expect, "step output 1")
        assert proc.poll() is None  # the job runs on, and so does --follow
        await append(db, job.job_id, 1, 1, ["step output 2"])
        await asyncio.to_thread(reader.expect, "step output 2")
        await finish_job(db, job.job_id)
        assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_run_logs_prints_every_job_in_turn_or_one_with_job(server: ServerProcess, db: Database) -> None:
    first = await insert_job(db, step_names={1: "build"}, status="success")
    await append(db, first.job_id, 1, 0, ["built"])
    second = await _second_job(db, first)
    await append(db, second, 1, 0, ["tested"])
    env = {"CONVEYOR_URL": server.url, "CONVEYOR_TOKEN": server.owner_token()}

    everything = await asyncio.to_thread(run_cli, ["admin", "run", "logs", first.run_id], env=env)
    assert everything.returncode == 0, everything.stderr
    assert everything.stdout.splitlines() == [
        "==> build (success) <==",
        "── 1 build ──",
        "built",
        "==> test (running) <==",
        "── 1 step 1 ──",
        "tested",
    ]
    one = await asyncio.to_thread(run_cli, ["admin", "run", "logs", first.run_id, "--job", "test"], env=env)
    assert one.stdout.splitlines() == ["── 1 step 1 ──", "tested"]
    missing = await asyncio.to_thread(
        run_cli, ["admin", "run", "logs", first.run_id, "--job", "nope"], env=env
    )
    assert missing.returncode == 4 and "has no job 'nope'" in missing.stderr


async def _second_job(db: Database, run: RunningJob) -> str:
    from sqlalchemy import insert

    from conveyor.db.tables import jobs
    from conveyor.model.ids import new_id, utc_now

    job_id = new_id()
    async with db.transaction() as conn:
        await conn.execute(
            insert(jobs).values(
                id=job_id,
                run_id=run.run_id,
                org_id="default",
                name="test",
                display_name="test",
                status="running",
                runs_on={},
                created_at=utc_now(),
            )
        )
    return job_id
