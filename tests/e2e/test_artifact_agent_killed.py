"""End to end (docs/design/artifacts.md §8 scenario 3): a real `conveyor agent` is SIGKILLed during an
artifact upload. The artifact is absent from its run; the job ends `agent_lost` (docs/design/execution.md
§6: a job whose agent is lost after it started is never requeued), so a re-run of the run uploads it; and
once the blob sweep has run, the store holds exactly the blobs artifacts reference — no unreferenced blob,
no staging object, no unfinished multipart upload — with the filesystem store and with the S3 store
(moto's server, an S3 emulator), on SQLite and PostgreSQL.

Two moments of the kill: mid-upload (the scenario), and after the server stored the upload but before the
agent committed it (an uncommitted upload whose blob only the sweep removes). The agent reaches the server
through a loopback proxy that holds the upload — after `HOLD_AFTER` bytes of the request, or before the
server's answer — until the test has seen the server side reach that point and killed the agent; then it
passes on what is left and the end of the connection. The kill therefore lands where it is meant to,
however fast or loaded the machine is.
"""

from __future__ import annotations

import socket
import threading
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.support.agents import agent_process
from tests.support.cluster import LinkProxy
from tests.support.dispatch_stage import Stage, stage
from tests.support.http import HTTP
from tests.support.s3 import S3Emulator, s3_emulator
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

MIB = 1024 * 1024
# The proxy holds an upload after this much: more than one S3 part (8 MiB), well short of the file.
HOLD_AFTER = 20 * MIB

# 48 MiB seeded by SEED. Mid-upload, the same bytes in every run: the re-run uploads the very content the
# killed agent was sending. Before the commit, bytes of the run: the killed attempt's stored blob is one
# nothing will reference, which the sweep must delete while keeping the re-run's.
BIG = """
import hashlib, random
from conveyor import push, workflow

ci = workflow("ci", on=[push(branches=["main"])])

@ci.job(runs_on=["linux"])
def build(ctx):
    data = random.Random(SEED).randbytes(48 * 1024 * 1024)
    (ctx.workspace / "big.bin").write_bytes(data)
    stored = ctx.upload_artifact("big", "big.bin")
    assert stored.sha256 == hashlib.sha256(data).hexdigest(), stored
    return {"sha": stored.sha256}
"""

ENV = {
    # The retention sweep (and the blob sweep behind it) every half second, with a short grace: what the
    # killed upload left is old enough for it soon after, the re-run's upload still commits well inside.
    "CONVEYOR_RETENTION_INTERVAL_MS": "500",
    "CONVEYOR_BLOB_GRACE_MS": "3000",
}


SEEDS = {"mid-upload": "38", "before-commit": "ctx.run_id"}


class UploadHoldingProxy(LinkProxy):
    """A `LinkProxy` that holds a connection opening with an artifact upload until `release()`: after
    `hold_after` bytes from the agent (it reads nothing more from it), or, with `hold_after` None, before
    the server's answer reaches the agent."""

    def __init__(self, target_port: int, hold_after: int | None) -> None:
        self.hold_after = hold_after
        self.held = threading.Event()
        self._released = threading.Event()
        # Agent-side sockets of connections that opened with an upload (by identity: each is the source
        # of one pipe and the sink of the other).
        self._uploads: set[int] = set()
        super().__init__(target_port)

    def release(self) -> None:
        """Forward what the agent sent (and the end of its connection) from now on."""
        self._released.set()

    def _forward(self, source: socket.socket, sink: socket.socket) -> None:
        from_agent = source.getpeername()[1] != self.target_port
        forwarded = 0
        while data := source.recv(65536):
            if from_agent and forwarded == 0 and data.startswith(b"PUT /api/v1/uploads/"):
                self._uploads.add(id(source))
            if self._released.is_set():
                pass
            elif not from_agent and self.hold_after is None and id(sink) in self._uploads:
                self.held.set()
                self._released.wait()
            elif (
                from_agent
                and self.hold_after is not None
                and id(source) in self._uploads
                and forwarded + len(data) >= self.hold_after
            ):
                keep = self.hold_after - forwarded
                sink.sendall(data[:keep])
                forwarded += keep
                data = data[keep:]
                self.held.set()
                self._released.wait()
            sink.sendall(data)
            forwarded += len(data)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Emulator]:
    with s3_emulator(tmp_path_factory.mktemp("moto")) as emulator:
        yield emulator


class FilesystemView:
    """What the filesystem store holds, read from its directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def staged_bytes(self) -> int:
        staging = self.root / "staging"
        return sum(f.stat().st_size for f in staging.iterdir()) if staging.is_dir() else 0

    def leftovers(self) -> list[str]:
        """Staging files (and multipart uploads: none here)."""
        staging = self.root / "staging"
        return sorted(f.name for f in staging.iterdir()) if staging.is_dir() else []

    def blobs(self) -> set[str]:
        base = self.root / "sha256"
        return {f.name for f in base.glob("*/*")} if base.is_dir() else set()


class S3View:
    """What the S3 store holds, read over the S3 protocol (moto takes unsigned requests)."""

    NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"

    def __init__(self, emulator: S3Emulator, bucket: str, prefix: str = "blobs") -> None:
        self.url = f"{emulator.endpoint}/{bucket}"
        self.prefix = prefix

    def _xml(self, params: dict[str, str]) -> ElementTree.Element:
        answer = HTTP.get(self.url, params=params, timeout=10)
        assert answer.status_code == 200, answer.text
        return ElementTree.fromstring(answer.content)

    def uploads(self) -> list[tuple[str, str]]:
        """Unfinished multipart uploads: (key, upload id)."""
        root = self._xml({"uploads": "", "prefix": f"{self.prefix}/"})
        return [
            (u.findtext(f"{self.NS}Key", ""), u.findtext(f"{self.NS}UploadId", ""))
            for u in root.iter(f"{self.NS}Upload")
        ]

    def staged_bytes(self) -> int:
        """Bytes in the parts of unfinished uploads."""
        total = 0
        for key, upload_id in self.uploads():
            answer = HTTP.get(f"{self.url}/{key}", params={"uploadId": upload_id}, timeout=10)
            assert answer.status_code == 200, answer.text
            parts = ElementTree.fromstring(answer.content).iter(f"{self.NS}Part")
            total += sum(int(p.findtext(f"{self.NS}Size", "0")) for p in parts)
        return total

    def _keys(self) -> list[str]:
        root = self._xml({"list-type": "2", "prefix": f"{self.prefix}/"})
        return [c.findtext(f"{self.NS}Key", "") for c in root.iter(f"{self.NS}Contents")]

    def leftovers(self) -> list[str]:
        """Staging objects and unfinished multipart uploads."""
        staging = [k for k in self._keys() if k.startswith(f"{self.prefix}/staging/")]
        return staging + [f"multipart upload of {key}" for key, _ in self.uploads()]

    def blobs(self) -> set[str]:
        return {k.rsplit("/", 1)[1] for k in self._keys() if k.startswith(f"{self.prefix}/sha256/")}


def database_rows(database_url: str) -> tuple[set[str], set[str], int]:
    """(blobs rows, digests artifacts reference, uncommitted uploads)."""
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            rows = {r[0] for r in conn.execute(text("SELECT sha256 FROM blobs"))}
            referenced = {r[0] for r in conn.execute(text("SELECT blob_sha256 FROM artifacts"))}
            pending = int(conn.execute(text("SELECT count(*) FROM artifact_uploads")).scalar_one())
    finally:
        engine.dispose()
    return rows, referenced, pending


def job_of(s: Stage, run_id: str) -> dict[str, object]:
    jobs: list[dict[str, object]] = s.api("GET", f"/runs/{run_id}/jobs").json()["items"]
    return next(j for j in jobs if j["name"] == "build")


def uploads_pending(database_url: str) -> list[str]:
    """Digests of uploads stored and not committed."""
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            return [r[0] for r in conn.execute(text("SELECT sha256 FROM artifact_uploads"))]
    finally:
        engine.dispose()


@pytest.mark.timeout(420)
# Mid-upload (the scenario) on both stores; the kill between upload and commit on the S3 store, whose
# staging, copy and multipart cleanup have the most to leave behind.
@pytest.mark.parametrize(
    ("store", "moment"), [("filesystem", "mid-upload"), ("s3", "mid-upload"), ("s3", "before-commit")]
)
def test_an_agent_killed_during_an_upload_leaves_no_artifact_and_after_a_rerun_and_the_sweep_no_leftovers(
    database_url: str, tmp_path: Path, store: str, moment: str, request: pytest.FixtureRequest
) -> None:
    env = dict(ENV)
    view: FilesystemView | S3View = FilesystemView(tmp_path / "home" / "blobs")
    if store == "s3":
        emulator: S3Emulator = request.getfixturevalue("s3")
        bucket = emulator.create_bucket()
        env |= emulator.env(bucket)
        view = S3View(emulator, bucket)
    with stage(tmp_path, database_url, {"ci": BIG.replace("SEED", SEEDS[moment])}, env=env) as s:
        proxy = UploadHoldingProxy(s.server.port, HOLD_AFTER if moment == "mid-upload" else None)
        direct = s.ws_url
        s.ws_url = proxy.url.replace("http://", "ws://") + "/ws"
        killed_sha = ""
        try:
            with agent_process(s, tmp_path / "agent-home") as agent:
                run_id = s.push()
                wait_until(proxy.held.is_set, timeout=120, what="the agent's upload to reach the hold")
                if moment == "mid-upload":
                    # The server has the first part of the upload in staging (a file, or S3 parts).
                    wait_until(
                        lambda: view.staged_bytes() >= 8 * MIB, timeout=60, what="bytes in the staging object"
                    )
                else:
                    # The server stored the blob and its upload row; the agent never sees the answer.
                    (killed_sha,) = uploads_pending(database_url)
                    assert view.blobs() == {killed_sha}
                agent.kill()
                agent.wait(timeout=30)
                proxy.release()
                failed = s.wait_run(run_id, "failed", timeout=60)
        finally:
            proxy.close()
            s.ws_url = direct
        build = job_of(s, run_id)
        assert (build["status"], str(build["reason"]).split(":")[0]) == ("failed", "agent_lost"), failed
        assert s.api("GET", f"/runs/{run_id}/artifacts").json()["items"] == []

        # The same agent home again: its next start also kills the runner the SIGKILL orphaned.
        with agent_process(s, tmp_path / "agent-home", reuse_token=True):
            answer = s.api("POST", f"/runs/{run_id}/rerun", json={"failed_only": False})
            assert answer.status_code == 201, answer.text
            rerun = answer.json()["id"]
            s.wait_run(rerun, "success", timeout=180)
        sha = job_of(s, rerun)["outputs"]["build"]["sha"]  # type: ignore[index]
        listing = s.api("GET", f"/runs/{rerun}/artifacts").json()["items"]
        assert [(a["name"], a["sha256"], a["size"]) for a in listing] == [("big", sha, 48 * MIB)]
        assert s.api("GET", f"/runs/{run_id}/artifacts").json()["items"] == []

        def swept() -> bool:
            rows, referenced, pending = database_rows(database_url)
            return rows == referenced == view.blobs() == {sha} and pending == 0 and not view.leftovers()

        assert killed_sha != sha

        try:
            wait_until(swept, timeout=60, what="the blob sweep to leave only the re-run's blob")
        except AssertionError:
            rows, referenced, pending = database_rows(database_url)
            raise AssertionError(
                f"blobs rows {rows}, referenced {referenced}, uncommitted uploads {pending}, "
                f"stored {view.blobs()}, leftovers {view.leftovers()}"
            ) from None
