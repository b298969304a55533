"""Caches under `conveyor run local` (docs/design/caches.md §5): one directory shared by local runs, one
`<sha256>.tar.zst` per entry and an `index.json`; the server's choice and immutability rules."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from conveyor.agent.caches import CachePathError, Roots, restore_archive, write_archive
from conveyor.errors import ConveyorError
from conveyor.model.caches import Candidate, choose_entry, key_problem
from conveyor.model.ids import format_rfc3339, utc_now

DEFAULT_DIRECTORY = Path("~/.cache/conveyor/local-caches")


class LocalCacheError(ConveyorError):
    """What the step is told (as a warning: a cache never fails a step)."""


class LocalCaches:
    """The local cache directory, seen from one local run (`scopes`: what it reads, nearest first)."""

    def __init__(self, directory: Path, scopes: tuple[str, ...]) -> None:
        self.directory = directory.expanduser()
        self.scopes = scopes
        self.index_path = self.directory / "index.json"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        """The index under an exclusive lock (jobs of one run, and several runs, share the directory);
        written back with a temporary file and a rename."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "index.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            index: dict[str, Any] = {"entries": []}
            if self.index_path.exists():
                index = json.loads(self.index_path.read_text())
            yield index
            temporary = self.index_path.with_suffix(".json.tmp")
            temporary.write_text(json.dumps(index, indent=2))
            os.replace(temporary, self.index_path)

    def handle(self, request: Mapping[str, Any]) -> Any:
        """Carry out one step request (`cache.restore`, `cache.save`)."""
        op = request.get("op")
        key = str(request.get("key"))
        problem = key_problem(key)
        if problem is not None:
            raise LocalCacheError(problem)
        roots = Roots(Path(str(request["workspace"])), Path(str(request["home"])))
        if op == "cache.restore":
            return self._restore(roots, key, [str(p) for p in request.get("restore_keys") or ()])
        if op == "cache.save":
            pairs = [(str(label), str(path)) for label, path in request["paths"]]
            return self._save(roots, key, pairs)
        raise LocalCacheError(f"unknown cache request {op!r}")

    def _restore(self, roots: Roots, key: str, restore_keys: list[str]) -> dict[str, Any]:
        with self._locked() as index:
            candidates = [
                Candidate(
                    item["sha256"], item["scope"], item["key"], datetime.fromisoformat(item["created_at"])
                )
                for item in index["entries"]
            ]
            choice = choose_entry(candidates, key, restore_keys, self.scopes)
            if choice.entry is None:
                return {"kind": "miss", "key": None}
            chosen = choice.entry
            for item in index["entries"]:
                if (
                    item["sha256"] == chosen.id
                    and item["scope"] == chosen.scope
                    and item["key"] == chosen.key
                ):
                    item["last_used_at"] = format_rfc3339(utc_now())
        try:
            with open(self.directory / f"{chosen.id}.tar.zst", "rb") as source:
                restore_archive(roots, source)
        except (OSError, ValueError, tarfile.TarError) as error:
            raise LocalCacheError(f"cache {chosen.key}: restore failed: {error}") from None
        return {"kind": choice.kind, "key": chosen.key}

    def _save(self, roots: Roots, key: str, pairs: list[tuple[str, str]]) -> dict[str, Any]:
        scope = self.scopes[0]
        with self._locked() as index:
            if any(item["scope"] == scope and item["key"] == key for item in index["entries"]):
                return {"saved": False, "reason": "exists"}
        # Archive outside the lock (it may take a while); a concurrent save of the key is settled below.
        self.directory.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=self.directory, suffix=".partial")
        try:
            with os.fdopen(handle, "wb") as out:
                count = write_archive(roots, pairs, out)
            if count == 0:
                return {"saved": False, "reason": "no paths exist"}
            with open(name, "rb") as written:
                sha256 = hashlib.file_digest(written, "sha256").hexdigest()
            with self._locked() as index:
                if any(item["scope"] == scope and item["key"] == key for item in index["entries"]):
                    return {"saved": False, "reason": "exists"}
                os.replace(name, self.directory / f"{sha256}.tar.zst")
                now = format_rfc3339(utc_now())
                size = (self.directory / f"{sha256}.tar.zst").stat().st_size
                index["entries"].append(
                    {
                        "scope": scope,
                        "key": key,
                        "sha256": sha256,
                        "size": size,
                        "created_at": now,
                        "last_used_at": now,
                    }
                )
            return {"saved": True, "size": size}
        except CachePathError as error:
            raise LocalCacheError(str(error)) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)
