"""The content and lock-file caches' knobs (docs/design/execution.md §1.1), on both databases.

Each knob bounds its cache live: a delivery whose content was evicted (or never kept) fetches the lock from
GitHub again, and one whose parsed lock was evicted parses it again. The tests count the fake GitHub's
contents and compare requests and the caches' own counters; time is the caches' injected clock.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conveyor.ingest.pipeline import DeliveryPipeline
from conveyor.ingest.service import INGEST
from tests.fakes.github import FakeGitHub, push_payload
from tests.support.github_ingest import add_github_source, post, processed
from tests.support.inprocess import InProcessServer
from tests.support.repos import commit_all, git

LOCK = ".conveyor/conveyor.lock.json"
CONTENTS = f"GET /repos/acme/app/contents/{LOCK}"
COMPARE = "GET /repos/acme/app/compare/"


async def patch_cluster(server: InProcessServer, values: dict[str, Any]) -> None:
    answer = await server.client.patch("/api/v1/admin/cluster-settings", json=values, headers=server.auth())
    assert answer.status_code == 200, answer.text


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def pipeline_of(server: InProcessServer) -> DeliveryPipeline:
    return server.state.parts.need(INGEST).pipeline


def commits(repo: Path, count: int, *, new_lock: bool = False) -> list[str]:
    """`count` new commits; with `new_lock`, each with lock bytes of its own (a trailing newline more)."""
    made = []
    for index in range(count):
        if new_lock:
            path = repo / LOCK
            path.write_bytes(path.read_bytes() + b"\n")
        else:
            (repo / "README.md").write_text(f"change {index} {len(made)}\n")
        made.append(commit_all(repo, f"commit {index}"))
    return made


class Deliverer:
    """Posts push deliveries of commits, each under a delivery id of its own, and waits for them."""

    def __init__(self, server: InProcessServer, source: dict[str, Any], repo: Path) -> None:
        self.server, self.source, self.repo, self.count = server, source, repo, 0

    async def push(self, sha: str, payload: dict[str, Any] | None = None) -> None:
        self.count += 1
        body = payload or push_payload("acme/app", self.repo, ref="refs/heads/main", before=sha, after=sha)
        answer = await post(self.server, self.source["id"], body, delivery=f"d-{self.count}")
        assert answer.status_code == 202, answer.text
        row = await processed(self.server, answer.json()["delivery"])
        assert row["status"] == "processed", row


def lock_reads(github: FakeGitHub) -> int:
    return github.requests.count(CONTENTS)


async def test_the_content_cache_is_bounded_by_entries_bytes_and_ttl_and_a_miss_reads_the_commit_again(
    server: InProcessServer, github: FakeGitHub, repo: Path
) -> None:
    pipeline = pipeline_of(server)
    clock = Clock()
    pipeline.content_cache.entries.clock = clock
    deliver = Deliverer(server, await add_github_source(server, github), repo)
    one, two, three, four = commits(repo, 4)

    # The defaults keep what was fetched: a second delivery of a commit reads nothing from GitHub.
    await deliver.push(one)
    await deliver.push(one)
    assert lock_reads(github) == 1

    # content_cache_max: one entry; two commits in turn evict each other, so each delivery reads again.
    await patch_cluster(server, {"content_cache_max": 1})
    await deliver.push(two)
    await deliver.push(one)
    await deliver.push(two)
    assert lock_reads(github) == 4
    assert pipeline.content_cache.entries.stats["evicted_entries"] >= 2

    # content_cache_max_bytes below the lock's size: the lock is never kept.
    lock_size = (repo / LOCK).stat().st_size
    await patch_cluster(server, {"content_cache_max": None, "content_cache_max_bytes": 1024})
    assert lock_size > 1024
    await deliver.push(three)
    await deliver.push(three)
    # At least once per delivery (the read ahead and processing share a read only while it is in flight).
    assert lock_reads(github) >= 6
    assert pipeline.content_cache.entries.stats["too_large"] >= 2

    # content_cache_ttl_ms: kept, then read again once older than the TTL (the cache's own clock).
    await patch_cluster(server, {"content_cache_max_bytes": None, "content_cache_ttl_ms": 5000})
    reads = lock_reads(github)
    await deliver.push(four)
    clock.now += 4.9
    await deliver.push(four)
    assert lock_reads(github) == reads + 1
    clock.now += 0.1
    await deliver.push(four)
    assert lock_reads(github) == reads + 2
    assert pipeline.content_cache.entries.stats["expired"] >= 1


async def test_the_content_cache_keeps_the_compare_apis_changed_files_for_path_checks(
    server: InProcessServer, github: FakeGitHub, repo: Path
) -> None:
    deliver = Deliverer(server, await add_github_source(server, github), repo)
    before = git(repo, "rev-parse", "HEAD")
    (after,) = commits(repo, 1)
    # A push listing GitHub's cap of 2048 commits: its changed files come from the compare API.
    payload = push_payload("acme/app", repo, ref="refs/heads/main", before=before, after=after)
    payload["commits"] = payload["commits"] * 2048
    await deliver.push(after, payload)
    await deliver.push(after, payload)
    assert sum(request.startswith(COMPARE) for request in github.requests) == 1
    await patch_cluster(server, {"content_cache_max": 0})  # keep nothing
    await deliver.push(after, payload)
    assert sum(request.startswith(COMPARE) for request in github.requests) == 2


async def test_the_lockfile_cache_is_bounded_by_entries_bytes_and_ttl_and_a_miss_parses_the_lock_again(
    server: InProcessServer, github: FakeGitHub, repo: Path
) -> None:
    pipeline = pipeline_of(server)
    clock = Clock()
    pipeline.lockfile_cache.clock = clock
    stats = pipeline.lockfile_cache.stats
    deliver = Deliverer(server, await add_github_source(server, github), repo)
    one, two, three, four = commits(repo, 4, new_lock=True)

    # Two deliveries of one lock's bytes parse it once.
    await deliver.push(one)
    await deliver.push(one)
    assert (stats["miss"], stats["hit"]) == (1, 1)

    # lockfile_cache_max: one parsed lock; two locks in turn evict each other.
    await patch_cluster(server, {"lockfile_cache_max": 1})
    await deliver.push(two)
    await deliver.push(one)
    await deliver.push(two)
    assert stats["miss"] == 4 and stats["evicted_entries"] >= 2

    # lockfile_cache_max_bytes below the lock's size: parsed at every delivery, never kept.
    await patch_cluster(server, {"lockfile_cache_max": None, "lockfile_cache_max_bytes": 1024})
    await deliver.push(three)
    await deliver.push(three)
    assert stats["miss"] == 6 and stats["too_large"] >= 2

    # lockfile_cache_ttl_ms: kept, then parsed again once older than the TTL.
    await patch_cluster(server, {"lockfile_cache_max_bytes": None, "lockfile_cache_ttl_ms": 5000})
    await deliver.push(four)
    clock.now += 4.9
    await deliver.push(four)
    assert stats["miss"] == 7
    clock.now += 0.1
    await deliver.push(four)
    assert stats["miss"] == 8 and stats["expired"] >= 1
