"""Artifacts under `conveyor run local` (docs/design/artifacts.md §5): kept in the local run's directory,
`<run dir>/artifacts/`, with an `index.json`; the same names, formats and errors as on a server, no limits."""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conveyor.agent.artifact_files import artifact_blocks
from conveyor.errors import ConveyorError
from conveyor.model.ids import format_rfc3339, utc_now


class LocalArtifactError(ConveyorError):
    """What the step is told."""


class LocalArtifacts:
    """One local run's artifacts."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.index_path = directory / "index.json"

    def _index(self) -> dict[str, Any]:
        if not self.index_path.exists():
            return {"artifacts": [], "test_reports": []}
        loaded: dict[str, Any] = json.loads(self.index_path.read_text())
        return loaded

    def _save(self, index: Mapping[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.index_path.write_text(json.dumps(index, indent=2))

    def handle(self, job: str, request: Mapping[str, Any]) -> Any:
        """Carry out one step request (`upload`, `download`, `list`, `report`)."""
        op = request.get("op")
        index = self._index()
        if op == "list":
            return index["artifacts"]
        if op == "upload":
            return self._upload(job, request, index)
        if op == "download":
            return self._download(str(request["name"]), Path(str(request["dest"])), index)
        if op == "report":
            index["test_reports"].append(
                {"job": job, **{k: v for k, v in request.items() if k not in ("op", "request_id")}}
            )
            self._save(index)
            return {"artifact": request.get("artifact")}
        raise LocalArtifactError(f"unknown artifact request {op!r}")

    def _upload(self, job: str, request: Mapping[str, Any], index: dict[str, Any]) -> dict[str, Any]:
        name = str(request["name"])
        if any(item["name"] == name for item in index["artifacts"]):
            raise LocalArtifactError(f"artifact {name}: this run already has an artifact named {name!r}")
        root = Path(str(request["root"]))
        files = [str(f) for f in request["files"]]
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.directory / (f"{name}.tar" if request["format"] == "tar" else name)
        digest = hashlib.sha256()
        with open(target, "wb") as out:
            for chunk in artifact_blocks(root, files, request["format"]):
                digest.update(chunk)
                out.write(chunk)
        entry = {
            "name": name,
            "size": target.stat().st_size,
            "sha256": digest.hexdigest(),
            "job": job,
            "format": request["format"],
            "filename": request.get("filename"),
            "created_at": format_rfc3339(utc_now()),
            "path": str(target),
        }
        index["artifacts"].append(entry)
        self._save(index)
        return entry

    def _download(self, name: str, dest: Path, index: dict[str, Any]) -> dict[str, str]:
        found = next((item for item in index["artifacts"] if item["name"] == name), None)
        if found is None:
            raise LocalArtifactError(f"artifact {name}: this run has no artifact of that name")
        dest.mkdir(parents=True, exist_ok=True)
        if found["format"] == "file":
            target = dest / str(found.get("filename") or name)
            shutil.copyfile(found["path"], target)
            return {"path": str(target)}
        with tarfile.open(found["path"], "r:") as tar:
            tar.extractall(dest, filter="data")
        return {"path": str(dest)}
