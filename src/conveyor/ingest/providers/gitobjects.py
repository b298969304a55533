"""Reading the lock file at a SHA straight from a repository's object database, in process (pygit2).

The `git` and `local` providers used to run `git cat-file` and `git show` per delivery; a subprocess
costs milliseconds where libgit2 reads a loose or packed object in well under one. The read is
synchronous (run it in a thread) and only reads: it never writes to the repository, so it needs no
lock against a concurrent `git fetch`, whose packs appear atomically.

What libgit2 cannot do is fetch: a commit that is not in the repository (`CommitAbsent`) or a lock
blob a blob-less fetch left at the promisor remote (`BlobAbsent`) is for the caller to bring in with
`git`. A repository libgit2 does not open (an extension it does not know, say) or a SHA that is not
a full object id is `NotReadableInProcess`: the caller falls back to `git` for that read.
"""

from __future__ import annotations

import re
from pathlib import Path

from conveyor.errors import ConveyorError
from conveyor.lockfile import LOCK_PATH, check_lock_size

_FULL_OBJECT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


class CommitAbsent(ConveyorError):
    """The commit is not in the repository (yet): fetch it."""


class BlobAbsent(ConveyorError):
    """The commit and its tree are there but the lock blob is not (a blob-less fetch): fetch the blob."""

    def __init__(self, oid: str) -> None:
        super().__init__(f"lock blob {oid} is not in the repository")
        self.oid = oid


class NotReadableInProcess(ConveyorError):
    """libgit2 cannot answer this read (repository it does not open, abbreviated SHA): ask `git`."""


def read_lock_at(repository: Path, sha: str, max_bytes: int) -> bytes | None:
    """The lock file's bytes at commit `sha`, None when that commit has no lock file.

    Raises `LockTooLarge` from the object's header, before its content is read, for a lock over
    `max_bytes`; `CommitAbsent`, `BlobAbsent` or `NotReadableInProcess` as described above.
    """
    if not _FULL_OBJECT_ID.fullmatch(sha):
        raise NotReadableInProcess(f"{sha!r} is not a full object id")
    # Imported on first use: libgit2 and its bundled libraries add ≈ 20 MB of RSS, which an idle
    # coordinator (or one with only `github` sources) need not carry.
    import pygit2

    try:
        repo = pygit2.Repository(str(repository))
    except pygit2.GitError as exc:
        if not (repository / "HEAD").exists() and not (repository / ".git").exists():
            raise CommitAbsent(f"no repository at {repository} yet") from exc
        raise NotReadableInProcess(str(exc)) from exc
    try:
        target = repo.get(sha)
    except (ValueError, pygit2.GitError) as exc:
        raise NotReadableInProcess(str(exc)) from exc
    if target is None:
        raise CommitAbsent(f"commit {sha} is not in {repository}")
    try:
        tree = target.peel(pygit2.Tree)
    except (ValueError, pygit2.GitError, KeyError) as exc:  # a blob's id, or a tag of one
        raise NotReadableInProcess(str(exc)) from exc
    try:
        entry = tree[LOCK_PATH]
    except KeyError:
        return None
    if entry.type_str != "blob":
        return None
    oid = entry.id
    try:
        _kind, size = repo.odb.read_header(oid)
    except KeyError as exc:  # NotFoundError is a KeyError
        raise BlobAbsent(str(oid)) from exc
    check_lock_size(size, max_bytes)
    blob = repo[oid]
    assert isinstance(blob, pygit2.Blob)
    return blob.data
