"""An S3 **emulator** for the suite: moto's standalone server (`moto[server]`), started as a process on a
free port. It speaks the S3 protocol over real HTTP, so the blob store's S3 client is exercised exactly
as against an object store; it is not AWS, and nothing here claims AWS's consistency or limits."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.http import HTTP
from tests.support.processes import free_port
from tests.support.waiting import wait_until

# moto accepts any credentials; these only have to be present and stable.
ACCESS_KEY_ID = "conveyor-test"
SECRET_ACCESS_KEY = "conveyor-test-secret"
REGION = "us-east-1"


@dataclass
class S3Emulator:
    """A running moto server."""

    endpoint: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def create_bucket(self, name: str | None = None) -> str:
        """A new, empty bucket; its name."""
        bucket = name or f"conveyor-{uuid.uuid4().hex[:12]}"
        response = HTTP.put(f"{self.endpoint}/{bucket}", timeout=10)
        assert response.status_code == 200, response.text
        return bucket

    def env(self, bucket: str, prefix: str = "blobs") -> dict[str, str]:
        """The server settings that point a coordinator at `s3://bucket/prefix` on this emulator."""
        return {
            "CONVEYOR_BLOB_URL": f"s3://{bucket}/{prefix}",
            "CONVEYOR_BLOB_S3_ENDPOINT": self.endpoint,
            "CONVEYOR_BLOB_S3_REGION": REGION,
            "CONVEYOR_BLOB_S3_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "CONVEYOR_BLOB_S3_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
            "CONVEYOR_BLOB_S3_ALLOW_HTTP": "true",
        }


@contextmanager
def s3_emulator(log_dir: Path) -> Iterator[S3Emulator]:
    """Start moto's server on 127.0.0.1 and a free port; stop it afterwards."""
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"moto-{port}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    endpoint = f"http://127.0.0.1:{port}"
    emulator = S3Emulator(endpoint, process, log_path)

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"moto exited with {process.returncode}:\n{log_path.read_text()}")
        try:
            return HTTP.get(endpoint + "/moto-api/", timeout=2).status_code < 500
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, timeout=30, what="the S3 emulator to listen")
        yield emulator
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
