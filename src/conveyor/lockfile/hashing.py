"""The content hash that ties a lock entry to the sources it was compiled from
(docs/design/authoring.md §3)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

CONTENT_HASH_PREFIX = b"conveyor-content-v1\n"


def file_digest(data: bytes) -> str:
    """sha256 hex of the file with CRLF/CR normalised to LF, so checkouts on Windows hash alike."""
    normalised = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return hashlib.sha256(normalised).hexdigest()


def content_hash(files: Iterable[tuple[str, bytes]]) -> str:
    """`sha256:` + sha256 over `path NUL digest LF` for each (repo-relative path, bytes), sorted by path."""
    hasher = hashlib.sha256(CONTENT_HASH_PREFIX)
    for path, data in sorted(files):
        hasher.update(path.encode() + b"\0" + file_digest(data).encode() + b"\n")
    return "sha256:" + hasher.hexdigest()


def content_hash_of_checkout(root: Path, hashed_files: Iterable[str]) -> str:
    """Recompute a workflow's content hash from a checkout (raises FileNotFoundError for a missing file)."""
    return content_hash((path, (root / path).read_bytes()) for path in hashed_files)
