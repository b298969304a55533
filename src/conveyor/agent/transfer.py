"""The agent's side of artifacts (docs/design/artifacts.md §4–§5): it holds the job's credential and moves
the bytes for its steps over HTTP(S), to the orchestrator it is connected to.

An upload streams the files (a tar stream built block by block, or the one file) while hashing them in a
worker thread, then commits with the digest and size; a dropped connection, a 5xx or an upload the sweep
took starts it again from the beginning, up to `UPLOAD_ATTEMPTS` times. A download goes to a temporary file
in the workspace and is checked against its digest before it is placed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import ssl
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from conveyor.agent.artifact_files import artifact_blocks, file_blocks
from conveyor.agent.cache_store import EntryStore
from conveyor.agent.caches import CachePathError, Roots, restore_archive, write_archive
from conveyor.aio import read_ahead, write_hashed
from conveyor.errors import ConveyorError

log = logging.getLogger(__name__)

UPLOAD_ATTEMPTS = 4
FIRST_PAUSE_S = 0.5
PROGRESS_EVERY_S = 5.0
# An object store the agent cannot reach should cost a download little before it falls back.
STORE_CONNECT_TIMEOUT_S = 5.0
# A download is written and hashed in blocks of about this size.
WRITE_BYTES = 1024 * 1024
# `digest_mismatch`: the files changed between the hashing pass and the upload; both run again.
_RETRY_CODES = {"upload_expired", "digest_mismatch"}

T = TypeVar("T")


class ArtifactRequestFailed(ConveyorError):
    """What the step is told (it fails with this text)."""


def http_base(agent_url: str) -> str:
    """The orchestrator's HTTP base from the agent's `ws(s)://host:port/ws` URL."""
    parts = urlsplit(agent_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    path = parts.path[: -len("/ws")] if parts.path.endswith("/ws") else parts.path
    return urlunsplit((scheme, parts.netloc, path.rstrip("/"), "", ""))


def _detail(response: httpx.Response) -> tuple[str, str]:
    try:
        body = response.json()
        return str(body.get("error", "")), str(body.get("detail", response.text))
    except ValueError:
        return "", response.text[:300]


class ArtifactClient:
    """One job's artifact transfers."""

    def __init__(
        self,
        base_url: str,
        token: str,
        job_id: str,
        *,
        progress: Callable[[str], None] = lambda line: None,
        sleep: Callable[[float], Any] = asyncio.sleep,
        entries: EntryStore | None = None,
        digest_first: bool = False,
        direct_downloads: bool = False,
    ) -> None:
        self.base_url = base_url
        # The orchestrator's blob store writes an upload's final key directly when it knows the digest
        # before the bytes (an object store: no staging copy), worth one more read of the files here.
        self._digest_first = digest_first
        # The orchestrator may answer a whole download with a presigned URL of its object store.
        self._direct_downloads = direct_downloads
        self.job_id = job_id
        # The agent's store of recent cache entries (docs/design/caches.md §6); None: always download.
        self._entries = entries
        self._headers = {"Authorization": f"Bearer {token}"}
        self._progress = progress
        self._sleep = sleep

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.base_url,
            headers=self._headers,
            timeout=httpx.Timeout(60.0),
            verify=tls_context(),
        )

    async def handle(self, request: Mapping[str, Any]) -> Any:
        """Carry out one step request (`upload`, `download`, `list`, `report`)."""
        op = request.get("op")
        if op == "upload":
            return await self.upload(request)
        if op == "download":
            return await self.download(str(request["name"]), Path(str(request["dest"])))
        if op == "list":
            return await self.listing()
        if op == "report":
            return await self.report(request)
        if op == "cache.restore":
            return await self.cache_restore(request)
        if op == "cache.save":
            return await self.cache_save(request)
        raise ArtifactRequestFailed(f"unknown artifact request {op!r}")

    # -- upload -------------------------------------------------------------------------------------

    async def upload(self, request: Mapping[str, Any]) -> Any:
        """Upload and commit, retried from the start on a dropped connection or a 5xx."""
        return await self._retried(f"artifact {request['name']}", lambda: self._upload_once(request))

    async def _retried(self, label: str, once: Callable[[], Awaitable[T]]) -> T:
        """`once()` (an upload and its commit), started again after a `_Retryable` failure with a doubling
        pause, up to `UPLOAD_ATTEMPTS` times."""
        pause = FIRST_PAUSE_S
        for attempt in range(1, UPLOAD_ATTEMPTS):
            try:
                return await once()
            except _Retryable as error:
                self._progress(f"{label}: {error}; starting again ({attempt + 1}/{UPLOAD_ATTEMPTS})")
                await self._sleep(pause)
                pause *= 2
        try:
            return await once()
        except _Retryable as error:
            raise ArtifactRequestFailed(
                f"{label}: the upload failed {UPLOAD_ATTEMPTS} times: {error}"
            ) from None

    async def _upload_once(self, request: Mapping[str, Any]) -> Any:
        name = str(request["name"])
        root = Path(str(request["root"]))
        files = [str(f) for f in request["files"]]
        async with self._client() as client:
            found = await self._put(
                client, lambda: artifact_blocks(root, files, request["format"]), f"artifact {name}"
            )
            commit = {
                "name": name,
                "upload_id": found["upload_id"],
                "sha256": found["sha256"],
                "size": found["size"],
                "format": request["format"],
                "filename": request.get("filename"),
                "file_count": len(files),
                "retention_days": request.get("retention_days"),
            }
            try:
                made = await client.post(f"/api/v1/jobs/{quote(self.job_id)}/artifacts", json=commit)
            except httpx.TransportError as error:
                raise _Retryable(f"the connection failed ({type(error).__name__})") from None
            self._check(made, name)
            self._progress(f"artifact {name}: {found['size']} bytes stored (sha256 {found['sha256'][:12]}…)")
            return made.json()

    async def _put(
        self,
        client: httpx.AsyncClient,
        open_blocks: Callable[[], Iterator[bytes]],
        label: str,
        purpose: str | None = None,
    ) -> dict[str, Any]:
        """Stream the blocks to the upload route, hashing them in a worker thread; the stored upload once
        the server's digest and size agree with what was sent (docs/design/artifacts.md §4). With
        `digest_first`, a first pass hashes the blocks and the upload announces the digest: the server then
        refuses bytes that hash otherwise, so the second pass, the one sent, is not hashed again."""
        params = {"purpose": purpose} if purpose else {}
        announced: str | None = None
        if self._digest_first:
            try:
                announced = params["sha256"] = await asyncio.to_thread(_digest_of, open_blocks())
            except OSError as error:
                raise ArtifactRequestFailed(f"{label}: {error}") from None
        blocks = open_blocks()
        digest = hashlib.sha256()
        sent = [0]
        loop = asyncio.get_running_loop()
        last_note = [loop.time()]

        def next_block() -> bytes | None:
            return next(blocks, None) if announced is not None else _next_hashed(blocks, digest)

        async def body() -> AsyncIterator[bytes]:
            # The next block is read (and hashed) while this one is sent.
            async with contextlib.aclosing(read_ahead(next_block)) as chunks:
                async for chunk in chunks:
                    sent[0] += len(chunk)
                    if loop.time() - last_note[0] >= PROGRESS_EVERY_S:
                        last_note[0] = loop.time()
                        self._progress(f"{label}: {sent[0] / 1e6:.0f} MB sent")
                    yield chunk

        try:
            stored = await client.put(
                f"/api/v1/uploads/{quote(self.job_id)}",
                content=body(),
                params=params or None,
            )
        except httpx.TransportError as error:
            raise _Retryable(f"the connection failed ({type(error).__name__})") from None
        except OSError as error:
            raise ArtifactRequestFailed(f"{label}: {error}") from None
        self._check(stored, label.split(" ", 1)[-1])
        found: dict[str, Any] = stored.json()
        expected = announced or digest.hexdigest()
        if found["sha256"] != expected or found["size"] != sent[0]:
            raise _Retryable(
                f"the server stored {found['size']} bytes with SHA-256 {found['sha256']}, "
                f"{sent[0]} were sent with {expected}"
            )
        return found

    def _check(self, response: httpx.Response, name: str) -> None:
        if response.status_code < 300:
            return
        code, detail = _detail(response)
        if response.status_code >= 500 or code in _RETRY_CODES:
            raise _Retryable(f"HTTP {response.status_code}: {detail}")
        raise ArtifactRequestFailed(f"artifact {name}: {detail} ({code or response.status_code})")

    # -- reads --------------------------------------------------------------------------------------

    async def listing(self) -> list[dict[str, Any]]:
        """The run's artifacts."""
        async with self._client() as client:
            return await self._listing(client)

    async def _listing(self, client: httpx.AsyncClient) -> list[dict[str, Any]]:
        answer = await client.get(f"/api/v1/jobs/{quote(self.job_id)}/artifacts")
        self._check(answer, "list")
        items: list[dict[str, Any]] = answer.json()["items"]
        return items

    async def download(self, name: str, dest: Path) -> dict[str, str]:
        """Fetch into a temporary file beside `dest`, check the digest, then place or extract it."""
        async with self._client() as client:
            known = {item["name"]: item for item in await self._listing(client)}
            if name not in known:
                raise ArtifactRequestFailed(f"artifact {name}: this run has no artifact of that name")
            return await self._download(client, known[name], dest)

    async def _download(
        self, client: httpx.AsyncClient, artifact: dict[str, Any], dest: Path
    ) -> dict[str, str]:
        name = str(artifact["name"])
        handle = await asyncio.to_thread(_temporary_in, dest)
        temporary = Path(handle.name)
        try:
            url = f"/api/v1/jobs/{quote(self.job_id)}/artifacts/{quote(name)}/content"
            found = await self._fetch(client, url, {}, handle, name)
            handle.close()
            if found != artifact["sha256"]:
                raise ArtifactRequestFailed(
                    f"artifact {name}: the download hashes to {found}, not {artifact['sha256']}"
                )
            if artifact["format"] == "file":
                target = dest / str(artifact.get("filename") or name)
                os.replace(temporary, target)
                return {"path": str(target)}
            await asyncio.to_thread(_extract, temporary, dest)
            return {"path": str(dest)}
        except httpx.TransportError as error:
            raise ArtifactRequestFailed(
                f"artifact {name}: the download failed ({type(error).__name__})"
            ) from None
        finally:
            handle.close()
            await asyncio.to_thread(temporary.unlink, missing_ok=True)

    async def _fetch(
        self, client: httpx.AsyncClient, url: str, params: dict[str, str], handle: Any, name: str
    ) -> str:
        """Stream a GET into `handle`; the SHA-256 of what was written.

        With `direct_downloads` the orchestrator may answer 307 with a presigned URL of its object store:
        the bytes then come from there (without the job's credential), and if the store cannot be read
        from here, from the orchestrator after all (docs/design/artifacts.md §4 "Direct downloads").
        """
        ask = {**params, "direct": "1"} if self._direct_downloads else params
        async with client.stream("GET", url, params=ask, headers=_IDENTITY) as response:
            if response.status_code != 307 or "location" not in response.headers:
                return await self._read_answer(response, handle, name)
            location = response.headers["location"]
        try:
            return await _fetch_from_store(location, handle)
        except _StoreRefused as error:
            self._progress(f"{name}: the object store could not be read ({error}); through the orchestrator")
        await asyncio.to_thread(_rewind, handle)
        async with client.stream("GET", url, params=params, headers=_IDENTITY) as response:
            return await self._read_answer(response, handle, name)

    async def _read_answer(self, response: httpx.Response, handle: Any, name: str) -> str:
        """The answer's body written into `handle` (its SHA-256), or its error raised."""
        if response.status_code != 200:
            await response.aread()
            self._check(response, name)
        return await _write_hashed(response, handle)

    async def report(self, request: Mapping[str, Any]) -> Any:
        """Record a test summary."""
        body = {k: request[k] for k in ("artifact", "passed", "failed", "skipped", "errors", "failures")}
        async with self._client() as client:
            answer = await client.post(f"/api/v1/jobs/{quote(self.job_id)}/test-reports", json=body)
        self._check(answer, str(request["artifact"]))
        return answer.json()

    # -- caches (docs/design/caches.md §4) -----------------------------------------------------------

    async def cache_restore(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Look the key up, fetch the chosen entry into a temporary file beside the workspace, check its
        digest, then extract it into the workspace and the home."""
        key = str(request["key"])
        roots = Roots(Path(str(request["workspace"])), Path(str(request["home"])))
        lookup = {"key": key, "restore_keys": list(request.get("restore_keys") or [])}
        async with self._client() as client:
            answer = await client.post(
                f"/api/v1/jobs/{quote(self.job_id)}/caches/lookup", json=lookup, params=_step_of(request)
            )
        self._check(answer, f"cache {key}")
        found = answer.json()
        entry = found.get("entry")
        if entry is None:
            return {"kind": "miss", "key": None}
        local = (
            None if self._entries is None else await asyncio.to_thread(self._entries.find, entry["sha256"])
        )
        if local is not None:
            started = time.perf_counter()
            try:
                await asyncio.to_thread(_restore_file, roots, local)
            except FileNotFoundError:
                pass  # evicted between the look and the open: download it
            except tarfile.TarError as error:
                raise ArtifactRequestFailed(
                    f"cache {entry['key']}: the entry cannot be restored: {error}"
                ) from None
            else:
                self._progress(f"cache {key}: restored {entry['key']} from this agent's store")
                timings = {"extract_s": round(time.perf_counter() - started, 3)}
                return {"kind": found["kind"], "key": entry["key"], **timings}
        handle = await asyncio.to_thread(_temporary_in, roots.workspace.parent)
        temporary = Path(handle.name)
        started = time.perf_counter()
        try:
            async with self._client() as client:
                url = f"/api/v1/jobs/{quote(self.job_id)}/caches/content"
                fetched = await self._fetch(client, url, {"sha256": entry["sha256"]}, handle, f"cache {key}")
            handle.close()
            if fetched != entry["sha256"]:
                raise ArtifactRequestFailed(
                    f"cache {entry['key']}: the download hashes to {fetched}, not {entry['sha256']}"
                )
            downloaded = time.perf_counter()
            await asyncio.to_thread(_restore_file, roots, temporary)
            extracted = time.perf_counter()
            if self._entries is not None:
                await asyncio.to_thread(self._entries.keep, entry["sha256"], temporary)
        except httpx.TransportError as error:
            raise ArtifactRequestFailed(
                f"cache {key}: the download failed ({type(error).__name__})"
            ) from None
        except tarfile.TarError as error:
            raise ArtifactRequestFailed(
                f"cache {entry['key']}: the entry cannot be restored: {error}"
            ) from None
        finally:
            handle.close()
            await asyncio.to_thread(temporary.unlink, missing_ok=True)
        self._progress(f"cache {key}: restored {entry['key']} ({entry['size']} bytes)")
        # Where a restore's time went: the step's log says it (bench/caches.py reads it).
        timings = {
            "download_s": round(downloaded - started, 3),
            "extract_s": round(extracted - downloaded, 3),
        }
        return {"kind": found["kind"], "key": entry["key"], **timings}

    async def cache_save(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Archive the paths into a temporary file, upload it (retried as an artifact is) and commit it
        under the key; `{saved: false}` when another save of the key won."""
        key = str(request["key"])
        roots = Roots(Path(str(request["workspace"])), Path(str(request["home"])))
        pairs = [(str(label), str(path)) for label, path in request["paths"]]
        handle = await asyncio.to_thread(_temporary_in, roots.workspace.parent)
        temporary = Path(handle.name)
        try:
            try:
                count = await asyncio.to_thread(write_archive, roots, pairs, handle)
            except (OSError, CachePathError) as error:
                raise ArtifactRequestFailed(f"cache {key}: {error}") from None
            handle.close()
            if count == 0:
                return {"saved": False, "reason": "none of the paths exist"}
            step = _step_of(request)
            result, sha256 = await self._retried(
                f"cache {key}", lambda: self._save_once(key, temporary, step)
            )
            if self._entries is not None:
                await asyncio.to_thread(self._entries.keep, sha256, temporary)
            return result
        finally:
            handle.close()
            await asyncio.to_thread(temporary.unlink, missing_ok=True)

    async def _save_once(self, key: str, archive: Path, step: dict[str, int]) -> tuple[dict[str, Any], str]:
        async with self._client() as client:
            found = await self._put(client, lambda: file_blocks(archive), f"cache {key}", purpose="cache")
            body = {
                "key": key,
                "upload_id": found["upload_id"],
                "sha256": found["sha256"],
                "size": found["size"],
            }
            try:
                made = await client.post(f"/api/v1/jobs/{quote(self.job_id)}/caches", json=body, params=step)
            except httpx.TransportError as error:
                raise _Retryable(f"the connection failed ({type(error).__name__})") from None
            self._check(made, f"cache {key}")
            result: dict[str, Any] = made.json()
            return result, str(found["sha256"])


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for the process: building one loads the CA bundle (tens of milliseconds), which
    every transfer would otherwise pay again."""
    return httpx.create_ssl_context()


class _Retryable(ConveyorError):
    """A failure the upload starts again after."""


class _StoreRefused(ConveyorError):
    """The object store answered a presigned download with an error."""


# The raw bytes are the artifact's: no content coding on the way.
_IDENTITY = {"Accept-Encoding": "identity"}


async def _write_hashed(response: httpx.Response, handle: Any) -> str:
    """Write an answer's body into `handle`; its SHA-256. The pieces the connection delivers (64 KiB) are
    gathered, not joined, and handed to a worker thread about 1 MiB at a time, written and hashed there while
    the next ones arrive."""
    digest = hashlib.sha256()
    await write_hashed(response.aiter_raw(), handle, digest, WRITE_BYTES)
    return digest.hexdigest()


async def _fetch_from_store(location: str, handle: Any) -> str:
    """GET a presigned URL into `handle`; its SHA-256. `_StoreRefused` when the store cannot be read.

    Through obstore's HTTP client (Rust), which reads a large body about twice as fast here as httpx does;
    its store is rooted at the whole URL and asked for the empty path, which fetches that URL, query (the
    signature) included. It holds no credential: the job's is for the orchestrator, never for the store.
    """
    import obstore
    from obstore.exceptions import BaseError as ObstoreError
    from obstore.store import HTTPStore

    store = HTTPStore.from_url(
        location,
        client_options={
            "allow_http": location.startswith("http:"),
            "connect_timeout": f"{STORE_CONNECT_TIMEOUT_S:g}s",
            "timeout": "1h",
        },
        # The orchestrator is the fallback: a store that fails is given up on quickly, not for minutes.
        retry_config={"max_retries": 1, "retry_timeout": timedelta(seconds=STORE_CONNECT_TIMEOUT_S * 2)},
    )
    digest = hashlib.sha256()
    try:
        result = await obstore.get_async(store, "")
        pieces = (bytes(piece) async for piece in result.stream(min_chunk_size=WRITE_BYTES))
        await write_hashed(pieces, handle, digest, WRITE_BYTES)
    except (ObstoreError, FileNotFoundError) as error:  # obstore raises the builtin for a 404
        raise _StoreRefused(str(error).splitlines()[0][:200]) from None
    return digest.hexdigest()


def _rewind(handle: Any) -> None:
    handle.seek(0)
    handle.truncate()


def _digest_of(blocks: Iterator[bytes]) -> str:
    digest = hashlib.sha256()
    for chunk in blocks:
        digest.update(chunk)
    return digest.hexdigest()


def _next_hashed(blocks: Iterator[bytes], digest: Any) -> bytes | None:
    chunk = next(blocks, None)
    if chunk is not None:
        digest.update(chunk)
    return chunk


def _step_of(request: Mapping[str, Any]) -> dict[str, int]:
    """The query naming the step a cache call is for (docs/design/caches.md §7); empty when unknown."""
    index = request.get("step_index")
    return {} if index is None else {"step_index": int(index)}


def _temporary_in(dest: Path) -> Any:
    dest.mkdir(parents=True, exist_ok=True)
    return tempfile.NamedTemporaryFile(dir=dest, prefix=".artifact-", delete=False)


def _restore_file(roots: Roots, archive: Path) -> None:
    with open(archive, "rb") as source:
        restore_archive(roots, source)


def _extract(archive: Path, dest: Path) -> None:
    # The `data` filter refuses absolute paths, `..` and links out of `dest`.
    with tarfile.open(archive, "r:") as tar:
        tar.extractall(dest, filter="data")
