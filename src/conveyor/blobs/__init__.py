"""The blob store (docs/design/artifacts.md §2): bytes addressed by SHA-256, on files or an S3-compatible
object store, and the sweep that deletes what nothing references."""

from conveyor.blobs.backend import (
    BlobCorrupt,
    BlobError,
    BlobInfo,
    BlobMismatch,
    BlobNotFound,
    BlobStore,
    BlobStoreUnavailable,
    BlobTooLarge,
    StoredBlob,
)
from conveyor.blobs.location import BlobUrlInvalid, S3Options, open_blob_store, parse_blob_url
from conveyor.blobs.sweep import BlobSweep

__all__ = [
    "BlobCorrupt",
    "BlobError",
    "BlobInfo",
    "BlobMismatch",
    "BlobNotFound",
    "BlobStore",
    "BlobStoreUnavailable",
    "BlobSweep",
    "BlobTooLarge",
    "BlobUrlInvalid",
    "S3Options",
    "StoredBlob",
    "open_blob_store",
    "parse_blob_url",
]
