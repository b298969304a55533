"""Artifacts under `conveyor run local` (docs/design/artifacts.md §5): stored in the run's directory with the
digest and size of their bytes, read back by name, a taken name refused."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import pytest

from conveyor.agent.local_artifacts import LocalArtifactError, LocalArtifacts


def test_a_file_and_a_tar_artifact_are_stored_with_their_digest_and_read_back(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    (workspace / "out").mkdir(parents=True)
    data = bytes(range(256)) * 5000
    (workspace / "out" / "app.bin").write_bytes(data)
    (workspace / "out" / "notes.txt").write_text("notes\n")
    store = LocalArtifacts(tmp_path / "run" / "artifacts")

    single = store.handle(
        "build",
        {"op": "upload", "name": "app", "root": str(workspace), "files": ["out/app.bin"], "format": "file"},
    )
    assert (single["size"], single["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    both = store.handle(
        "build",
        {
            "op": "upload",
            "name": "out",
            "root": str(workspace),
            "files": ["out/app.bin", "out/notes.txt"],
            "format": "tar",
        },
    )
    stored = Path(both["path"]).read_bytes()
    assert (both["size"], both["sha256"]) == (len(stored), hashlib.sha256(stored).hexdigest())
    with tarfile.open(both["path"]) as tar:
        assert tar.getnames() == ["out/app.bin", "out/notes.txt"]

    with pytest.raises(LocalArtifactError, match="already has an artifact named 'app'"):
        store.handle(
            "build",
            {
                "op": "upload",
                "name": "app",
                "root": str(workspace),
                "files": ["out/app.bin"],
                "format": "file",
            },
        )
    assert [item["name"] for item in store.handle("test", {"op": "list"})] == ["app", "out"]
    dest = tmp_path / "later"
    placed = store.handle("test", {"op": "download", "name": "app", "dest": str(dest)})
    assert Path(placed["path"]).read_bytes() == data
    store.handle("test", {"op": "download", "name": "out", "dest": str(dest)})
    assert (dest / "out" / "notes.txt").read_text() == "notes\n"
