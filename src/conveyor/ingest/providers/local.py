"""`local` sources: a repository path on this host; the lock is read at the pushed SHA, never the tree."""

from __future__ import annotations

import asyncio
from pathlib import Path

from conveyor.ingest.providers.base import Ignored, ParsedDelivery, Refused, SourceRow, StatusReport
from conveyor.ingest.providers.forge import refusal
from conveyor.ingest.providers.gitcmd import GitError, lock_blob_size, run_git
from conveyor.ingest.providers.gitobjects import BlobAbsent, CommitAbsent, NotReadableInProcess, read_lock_at
from conveyor.lockfile import LOCK_PATH, check_lock_size
from conveyor.lockfile.reader import MAX_LOCK_BYTES
from conveyor.matching import Event, ref_event
from conveyor.model.gitnames import commit_id_problem, ref_problem

NULL_SHA = "0" * 40


class LocalProvider:
    """Reads the repository at `source.repo` in place (pygit2 for the lock, git for the rest)."""

    def normalise(
        self, source: SourceRow, delivery: ParsedDelivery, delivery_row_id: str
    ) -> Event | Ignored | Refused:
        """A trigger-local call is a ref update (its ref and commit ids checked, as a forge payload's)."""
        payload = delivery.payload
        before = payload.get("before") or NULL_SHA
        refused = refusal(
            [
                ("ref", payload.get("ref", ""), ref_problem),
                ("sha", payload.get("sha", ""), commit_id_problem),
                ("before", before, commit_id_problem),
            ]
        )
        if refused is not None:
            return refused
        return ref_event(
            repo=source.name,
            ref=str(payload["ref"]),
            sha=str(payload["sha"]),
            before=str(before),
            source="local",
            delivery_id=delivery_row_id,
            default_branch=source.default_branch,
            changed_files=payload.get("changed_files"),
            payload=payload,
        )

    async def resolve_ref(self, source: SourceRow, ref: str) -> str | None:
        """`git rev-parse --verify <ref>^{commit}`."""
        try:
            out = await run_git(
                "rev-parse", "--verify", "-q", "--end-of-options", f"{ref}^{{commit}}", cwd=Path(source.repo)
            )
        except GitError:
            return None
        return out.decode().strip() or None

    async def fetch_lock(
        self, source: SourceRow, sha: str, *, max_bytes: int = MAX_LOCK_BYTES
    ) -> bytes | None:
        """The lock at `sha`, read in place from the repository's objects (in process, no subprocess).

        `git` answers only what libgit2 cannot: a repository it does not open, an abbreviated SHA, a
        lock blob a partial clone left at its promisor remote.
        """
        try:
            return await asyncio.to_thread(read_lock_at, Path(source.repo), sha, max_bytes)
        except CommitAbsent:
            return None  # as `git show` answers for an unknown object
        except (BlobAbsent, NotReadableInProcess):
            return await self._show(source, sha, max_bytes)

    async def _show(self, source: SourceRow, sha: str, max_bytes: int) -> bytes | None:
        """`git show <sha>:.conveyor/conveyor.lock.json`, once its size is known to be within `max_bytes`."""
        try:
            size = await lock_blob_size(f"{sha}:{LOCK_PATH}", Path(source.repo))
            if size is None:
                return None
            check_lock_size(size, max_bytes)
            return await run_git("show", "--end-of-options", f"{sha}:{LOCK_PATH}", cwd=Path(source.repo))
        except GitError as exc:
            if "does not exist" in str(exc) or "exists on disk, but not in" in str(exc):
                return None
            raise

    async def changed_files(self, source: SourceRow, event: Event) -> list[str] | None:
        """`git diff --name-only <before> <sha>`; unknown for new or deleted refs."""
        if not event.before or not event.sha:
            return None
        try:
            out = await run_git(
                "diff", "--name-only", "--end-of-options", event.before, event.sha, cwd=Path(source.repo)
            )
        except GitError:
            return None
        return sorted(line for line in out.decode().splitlines() if line)

    async def report(self, source: SourceRow, report: StatusReport) -> str | None:
        """Local sources report nothing."""
        return None


async def commit_exists(path: Path, sha: str) -> bool:
    """Whether `sha` names a commit of the repository at `path`."""
    try:
        await run_git("cat-file", "-e", "--end-of-options", f"{sha}^{{commit}}", cwd=path)
    except GitError:
        return False
    return True


async def resolve_ref(path: Path, ref: str) -> str:
    """The commit a ref points at."""
    return (await run_git("rev-parse", "--verify", "--end-of-options", ref, cwd=path)).decode().strip()
