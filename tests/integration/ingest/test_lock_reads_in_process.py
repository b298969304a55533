"""Reading the lock at a SHA in process: from a `git` source's bare cache (fetching only what is absent)
and from a `local` source's repository in place, with the lock reader's errors unchanged."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from conveyor.ingest.providers.base import SourceRow
from conveyor.ingest.providers.git import GitProvider
from conveyor.ingest.providers.gitobjects import CommitAbsent, read_lock_at
from conveyor.ingest.providers.local import LocalProvider
from conveyor.lockfile import LOCK_PATH, LockReadError, parse_lock
from conveyor.lockfile.errors import LockTooLarge
from tests.support.repos import commit_all, git, make_repo


def source_row(kind: str, repo: str, clone_url: str | None = None) -> SourceRow:
    return SourceRow(
        id="src-1",
        org_id="default",
        name="app",
        kind=kind,
        routing_key=f"{kind}:app",
        repo=repo,
        api_url=None,
        clone_url=clone_url,
        default_branch="main",
        verify="none",
        signature_header=None,
        event_header=None,
        report="none",
        enabled=True,
    )


async def no_secret(source_id: str, name: str) -> str | None:
    return None


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    """A repository serving fetch-by-SHA and blob-less fetches over file://."""
    repo = make_repo(tmp_path / "origin")
    git(repo, "config", "uploadpack.allowFilter", "true")
    git(repo, "config", "uploadpack.allowAnySHA1InWant", "true")
    return repo


def committed_lock(repo: Path, sha: str) -> bytes:
    return git(repo, "show", f"{sha}:{LOCK_PATH}").encode() + b"\n"


def cache_state(cache: Path) -> dict[str, float]:
    """Every file of the bare cache with its modification time."""
    return {str(p): p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}


async def test_more_concurrent_reads_of_an_absent_sha_than_worker_threads_all_finish(
    origin: Path, tmp_path: Path
) -> None:
    """Deliveries waiting for the cache's fetch lock must not hold every worker thread: the one that
    holds the lock needs a thread to read, or nobody finishes (a webhook burst on a new commit)."""
    provider = GitProvider(tmp_path / "git-cache", no_secret)
    source = source_row("git", "team/app", f"file://{origin}")
    sha = git(origin, "rev-parse", "HEAD")
    # 40 readers: more than the default executor's threads (at most 32) on any machine.
    async with asyncio.timeout(60):
        reads = await asyncio.gather(*(provider.fetch_lock(source, sha) for _ in range(40)))
    assert set(reads) == {committed_lock(origin, sha)}
    assert provider.fetches == 1


async def test_git_source_absent_sha_is_fetched_once_then_read_without_fetching(
    origin: Path, tmp_path: Path
) -> None:
    provider = GitProvider(tmp_path / "git-cache", no_secret)
    source = source_row("git", "team/app", f"file://{origin}")
    sha = git(origin, "rev-parse", "HEAD")

    first = await provider.fetch_lock(source, sha)

    assert first == committed_lock(origin, sha)
    assert (provider.fetches, provider.blob_fetches) == (1, 1)
    cache = tmp_path / "git-cache" / "src-1.git"
    before = cache_state(cache)

    again = await provider.fetch_lock(source, sha)

    assert again == first
    assert (provider.fetches, provider.blob_fetches) == (1, 1)
    assert cache_state(cache) == before, "reading a present SHA must not write to the cache"


async def test_git_source_second_commit_costs_one_more_fetch(origin: Path, tmp_path: Path) -> None:
    provider = GitProvider(tmp_path / "git-cache", no_secret)
    source = source_row("git", "team/app", f"file://{origin}")
    await provider.fetch_lock(source, git(origin, "rev-parse", "HEAD"))
    (origin / "README.md").write_text("changed\n")
    second = commit_all(origin, "second")

    lock = await provider.fetch_lock(source, second)

    assert lock == committed_lock(origin, second)
    assert provider.fetches == 2


async def test_git_source_reads_packed_objects_after_gc_without_fetching(
    origin: Path, tmp_path: Path
) -> None:
    provider = GitProvider(tmp_path / "git-cache", no_secret)
    source = source_row("git", "team/app", f"file://{origin}")
    sha = git(origin, "rev-parse", "HEAD")
    expected = await provider.fetch_lock(source, sha)
    cache = tmp_path / "git-cache" / "src-1.git"
    git(cache, "gc", "-q", "--prune=now")
    assert not [p for p in (cache / "objects").glob("??/*")], "gc left loose objects"

    reread = GitProvider(tmp_path / "git-cache", no_secret)
    assert await reread.fetch_lock(source, sha) == expected
    assert (reread.fetches, reread.blob_fetches) == (0, 0)


async def test_git_source_commit_without_lock_is_none(origin: Path, tmp_path: Path) -> None:
    git(origin, "rm", "-q", LOCK_PATH)
    sha = commit_all(origin, "no lock")
    provider = GitProvider(tmp_path / "git-cache", no_secret)

    assert await provider.fetch_lock(source_row("git", "team/app", f"file://{origin}"), sha) is None
    assert provider.fetches == 1


async def test_git_source_lock_over_the_limit_is_refused(origin: Path, tmp_path: Path) -> None:
    provider = GitProvider(tmp_path / "git-cache", no_secret)
    source = source_row("git", "team/app", f"file://{origin}")
    sha = git(origin, "rev-parse", "HEAD")
    size = len(committed_lock(origin, sha))

    with pytest.raises(LockTooLarge, match=f"{size} bytes, over the 100-byte limit"):
        await provider.fetch_lock(source, sha, max_bytes=100)
    # The blob is now in the cache: the in-process read refuses it from its header too.
    with pytest.raises(LockTooLarge):
        await provider.fetch_lock(source, sha, max_bytes=100)
    assert provider.fetches == 1


async def test_local_source_reads_the_commit_not_the_working_tree(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    sha = git(repo, "rev-parse", "HEAD")
    committed = committed_lock(repo, sha)
    (repo / LOCK_PATH).write_text("{ not committed")

    assert await LocalProvider().fetch_lock(source_row("local", str(repo)), sha) == committed


async def test_local_source_reads_packed_objects_after_gc(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    sha = git(repo, "rev-parse", "HEAD")
    committed = committed_lock(repo, sha)
    git(repo, "gc", "-q", "--prune=now")
    assert not [p for p in (repo / ".git" / "objects").glob("??/*")]

    assert await LocalProvider().fetch_lock(source_row("local", str(repo)), sha) == committed


async def test_local_source_unknown_commit_or_missing_lock_is_none(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    git(repo, "rm", "-q", LOCK_PATH)
    without = commit_all(repo, "no lock")
    source = source_row("local", str(repo))

    assert await LocalProvider().fetch_lock(source, without) is None
    assert await LocalProvider().fetch_lock(source, "1" * 40) is None


async def test_local_source_lock_over_the_limit_and_bad_json_keep_their_errors(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    source = source_row("local", str(repo))
    with pytest.raises(LockTooLarge, match="over the 64-byte limit"):
        await LocalProvider().fetch_lock(source, git(repo, "rev-parse", "HEAD"), max_bytes=64)
    (repo / LOCK_PATH).write_text("{ not json")
    broken = commit_all(repo, "broken lock")

    raw = await LocalProvider().fetch_lock(source, broken)

    assert raw == b"{ not json"
    with pytest.raises(LockReadError) as caught:
        parse_lock(raw)
    assert caught.value.code == "lock_invalid_json"


async def test_local_source_abbreviated_sha_falls_back_to_git(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    sha = git(repo, "rev-parse", "HEAD")

    assert await LocalProvider().fetch_lock(source_row("local", str(repo)), sha[:12]) == committed_lock(
        repo, sha
    )


def test_in_process_read_of_a_cache_not_created_yet_asks_for_a_fetch(tmp_path: Path) -> None:
    with pytest.raises(CommitAbsent):
        read_lock_at(tmp_path / "missing.git", "a" * 40, 1024)
    assert not os.path.exists(tmp_path / "missing.git")
