"""Which blob store a node uses: `CONVEYOR_BLOB_URL` and its S3 options (docs/design/artifacts.md §2)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from conveyor.blobs.backend import BlobStore
from conveyor.errors import ConveyorError


class BlobUrlInvalid(ConveyorError, ValueError):
    """`CONVEYOR_BLOB_URL` names no store this build can open."""


@dataclass(frozen=True)
class FileLocation:
    """Blobs under a directory."""

    root: Path


@dataclass(frozen=True)
class S3Location:
    """Blobs under a prefix of a bucket."""

    bucket: str
    prefix: str


@dataclass(frozen=True)
class S3Options:
    """How to reach an S3-compatible store (unset values: the client's usual chain and AWS)."""

    endpoint: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    allow_http: bool = False


def parse_blob_url(url: str, home: Path) -> FileLocation | S3Location:
    """Where blobs live: empty → `<home>/blobs`; `file:///path`; `s3://bucket[/prefix]`."""
    text = url.strip()
    if not text:
        return FileLocation(home / "blobs")
    parts = urlsplit(text)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise BlobUrlInvalid(
                f"CONVEYOR_BLOB_URL {text!r}: a file URL names an absolute path (file:///srv/blobs)"
            )
        return FileLocation(Path(parts.path))
    if parts.scheme == "s3":
        if not parts.netloc:
            raise BlobUrlInvalid(f"CONVEYOR_BLOB_URL {text!r}: an S3 URL names a bucket (s3://bucket/prefix)")
        if parts.query or parts.fragment:
            raise BlobUrlInvalid(
                f"CONVEYOR_BLOB_URL {text!r}: no query or fragment (endpoint and keys are settings)"
            )
        return S3Location(parts.netloc, parts.path.strip("/"))
    raise BlobUrlInvalid(f"CONVEYOR_BLOB_URL {text!r}: the scheme must be file or s3")


def open_blob_store(location: FileLocation | S3Location, options: S3Options | None = None) -> BlobStore:
    """The store at `location` (nothing is contacted yet)."""
    if isinstance(location, FileLocation):
        from conveyor.blobs.filesystem import FilesystemBlobStore

        return FilesystemBlobStore(location.root)
    from conveyor.blobs.s3 import S3BlobStore

    options = options or S3Options()
    return S3BlobStore.connect(
        location.bucket,
        location.prefix,
        endpoint=options.endpoint,
        region=options.region,
        access_key_id=options.access_key_id,
        secret_access_key=options.secret_access_key,
        allow_http=options.allow_http,
    )
