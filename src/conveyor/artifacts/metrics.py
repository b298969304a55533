"""Artifact and blob metrics (docs/design/artifacts.md §6), in the server's per-process registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ArtifactMetrics:
    """The collectors of uploads, downloads, stored bytes and the blob sweep."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry or CollectorRegistry()
        self.stored_bytes = Gauge("conveyor_artifact_bytes", "Bytes of live artifacts", registry=r)
        self.uploads = Counter(
            "conveyor_artifact_uploads_total", "Artifact uploads by outcome", ["outcome"], registry=r
        )
        self.upload_bytes = Counter(
            "conveyor_artifact_upload_bytes_total", "Bytes received by artifact uploads", registry=r
        )
        self.downloads = Counter(
            "conveyor_artifact_downloads_total", "Artifact downloads by outcome", ["outcome"], registry=r
        )
        self.download_bytes = Counter(
            "conveyor_artifact_download_bytes_total", "Bytes served by artifact downloads", registry=r
        )
        self.blobs_deleted = Counter(
            "conveyor_blobs_deleted_total", "Blobs deleted by the sweep", ["reason"], registry=r
        )
        # docs/design/caches.md §6
        self.cache_lookups = Counter(
            "conveyor_cache_lookups_total", "Cache lookups by what they found", ["kind"], registry=r
        )
        self.cache_saves = Counter(
            "conveyor_cache_saves_total", "Cache entry commits by outcome", ["outcome"], registry=r
        )
        self.cache_saved_bytes = Counter(
            "conveyor_cache_saved_bytes_total", "Bytes of cache entries saved", registry=r
        )
        self.cache_restored_bytes = Counter(
            "conveyor_cache_restored_bytes_total", "Bytes of cache entries served for restores", registry=r
        )
