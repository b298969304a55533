"""`git` sources: any forge's webhooks; the lock is read in process from a bare cache, which a shallow,
blob-less fetch at the SHA fills when the commit is not there yet."""

from __future__ import annotations

import asyncio
import fcntl
from collections.abc import Awaitable, Callable
from pathlib import Path

from conveyor.ingest.providers.base import (
    Ignored,
    ParsedDelivery,
    Refused,
    Retryable,
    SourceRow,
    StatusReport,
)
from conveyor.ingest.providers.forge import normalise_forge
from conveyor.ingest.providers.gitcmd import GitError, lock_blob_size, run_git
from conveyor.ingest.providers.gitobjects import BlobAbsent, CommitAbsent, NotReadableInProcess, read_lock_at
from conveyor.ingest.providers.parsing import changed_files_from_commits
from conveyor.lockfile import LOCK_PATH, check_lock_size
from conveyor.lockfile.reader import MAX_LOCK_BYTES
from conveyor.matching import Event

SecretLookup = Callable[[str, str], Awaitable[str | None]]


class GitProvider:
    """Keeps a bare cache per source under `$CONVEYOR_HOME/git-cache`, read in process (pygit2)."""

    def __init__(self, cache_dir: Path, secret: SecretLookup) -> None:
        self._cache_dir = cache_dir
        self._secret = secret
        # `git fetch` runs of a commit, and on-demand fetches of a lock blob, since start (for tests
        # and diagnostics: a lock read from what the cache already holds adds to neither).
        self.fetches = 0
        self.blob_fetches = 0
        # Deliveries of this process queue for a cache here, not in `flock`: a thread blocked in
        # `flock` per waiting delivery would use up the worker threads the lock's holder needs to read.
        self._fetching: dict[Path, asyncio.Lock] = {}

    def normalise(
        self, source: SourceRow, delivery: ParsedDelivery, delivery_row_id: str
    ) -> Event | Ignored | Refused:
        """Pushes and pull requests of GitHub, Gitea, Gogs and GitLab shapes."""
        return normalise_forge(source, delivery, delivery_row_id)

    async def _env(self, source: SourceRow) -> dict[str, str]:
        token = await self._secret(source.id, "clone_token")
        if not token:
            return {}
        # The credential travels as an extra header through the environment, never in argv or config.
        return {
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "http.extraHeader",
            "GIT_CONFIG_VALUE_0": f"Authorization: Bearer {token}",
        }

    async def resolve_ref(self, source: SourceRow, ref: str) -> str | None:
        """`git ls-remote origin <ref>` (a full SHA is taken as is)."""
        if len(ref) == 40 and all(c in "0123456789abcdef" for c in ref):
            return ref
        try:
            out = await run_git(
                "ls-remote",
                "--end-of-options",
                source.clone_url or source.repo,
                ref,
                env=await self._env(source),
            )
        except GitError as exc:
            raise Retryable(str(exc)) from exc
        line = out.decode().split("\n", 1)[0]
        return line.split("\t", 1)[0] or None

    async def fetch_lock(
        self, source: SourceRow, sha: str, *, max_bytes: int = MAX_LOCK_BYTES
    ) -> bytes | None:
        """Read the lock at `sha` from the source's bare cache in process; `git fetch` only what is absent.

        A SHA whose commit and lock blob are already in the cache (a redelivery, a second push of
        the same commit, a lock evicted from the LRU, a restart) costs no subprocess at all.
        """
        repo = self._cache_dir / f"{source.id}.git"
        try:
            return await asyncio.to_thread(read_lock_at, repo, sha, max_bytes)
        except (CommitAbsent, BlobAbsent, NotReadableInProcess):
            pass
        repo.parent.mkdir(parents=True, exist_ok=True)
        async with self._fetching.setdefault(repo, asyncio.Lock()):
            with open(repo.with_suffix(".lock"), "w") as handle:
                # Fetches into one cache are serialised across processes too; at most one thread of
                # this process waits here per cache, for another process's fetch.
                await asyncio.to_thread(fcntl.flock, handle, fcntl.LOCK_EX)
                try:
                    return await self._fetch_and_read(source, repo, sha, max_bytes)
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)

    async def _fetch_and_read(self, source: SourceRow, repo: Path, sha: str, max_bytes: int) -> bytes | None:
        """Under the cache's lock: read again (another delivery of the commit may have fetched it while
        this one waited), fetch the commit or the lock blob that is absent, read again; each fetch once."""
        env = await self._env(source)
        fetched_commit = fetched_blob = False
        while True:
            try:
                return await asyncio.to_thread(read_lock_at, repo, sha, max_bytes)
            except CommitAbsent:
                if fetched_commit:
                    return None  # fetched, yet not there: as `git show` finds no such object
                await self._fetch_commit(source, repo, sha, env)
                fetched_commit = True
            except BlobAbsent as absent:
                if fetched_blob:
                    break
                await self._fetch_blob(repo, absent.oid, env)
                fetched_blob = True
            except NotReadableInProcess:
                if not fetched_commit:
                    await self._fetch_commit(source, repo, sha, env)
                break
        return await self._show(repo, sha, max_bytes, env)

    async def _fetch_commit(self, source: SourceRow, repo: Path, sha: str, env: dict[str, str]) -> None:
        """`git fetch --depth 1 --filter=blob:none origin <sha>` (the cache is created first if missing)."""
        self.fetches += 1
        try:
            if not (repo / "HEAD").exists():
                await run_git("init", "--bare", "-q", str(repo))
                await run_git(
                    "remote", "add", "--end-of-options", "origin", source.clone_url or source.repo, cwd=repo
                )
            await run_git(
                "fetch",
                "--depth",
                "1",
                "--filter=blob:none",
                "-q",
                "--end-of-options",
                "origin",
                sha,
                cwd=repo,
                env=env,
            )
        except GitError as exc:
            raise Retryable(str(exc)) from exc

    async def _fetch_blob(self, repo: Path, oid: str, env: dict[str, str]) -> None:
        """Bring the lock blob in from the promisor remote: `git cat-file -s` fetches a missing blob on demand."""
        self.blob_fetches += 1
        try:
            await run_git("cat-file", "-s", "--end-of-options", oid, cwd=repo, env=env)
        except GitError as exc:
            raise Retryable(str(exc)) from exc

    async def _show(self, repo: Path, sha: str, max_bytes: int, env: dict[str, str]) -> bytes | None:
        """`git cat-file -s`, then `git show`: for what libgit2 cannot read (an abbreviated SHA, say)."""
        try:
            # The size first (the blob-less fetch brings the blob in on demand, to disk): nothing
            # over `lock_file_max_bytes` is read into memory.
            size = await lock_blob_size(f"{sha}:{LOCK_PATH}", repo, env)
            if size is None:
                return None
            check_lock_size(size, max_bytes)
            return await run_git("show", "--end-of-options", f"{sha}:{LOCK_PATH}", cwd=repo, env=env)
        except GitError as exc:
            if "does not exist" in str(exc) or "exists on disk, but not in" in str(exc):
                return None
            raise Retryable(str(exc)) from exc

    async def changed_files(self, source: SourceRow, event: Event) -> list[str] | None:
        """From the payload's commits."""
        return changed_files_from_commits(event.payload)

    async def report(self, source: SourceRow, report: StatusReport) -> str | None:
        """`git` sources report nothing."""
        return None
