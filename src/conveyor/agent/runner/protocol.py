"""The runner's stdin/stdout protocol: JSON lines out (`Emitter`), the ready runner's placement line in."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from conveyor.agent.mirror import DEFAULT_MAX_BYTES, Mirrors


class Emitter:
    """JSON lines on stdout, one message per line, flushed at once."""

    def __init__(self, stream: TextIO, job_id: str) -> None:
        self.stream = stream
        self.job_id = job_id

    def __call__(self, message_type: str, /, **fields: Any) -> None:
        message = {"type": message_type, "job_id": self.job_id, **fields}
        self.stream.write(json.dumps(message, default=str) + "\n")
        self.stream.flush()


async def stdin_reader() -> asyncio.StreamReader:
    """The runner's stdin as a stream (lines up to 64 MiB: a job spec is one line)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


@dataclass(frozen=True)
class Placement:
    """Where a runner works: its workspace, the venvs directory, the mirrors (None: direct checkout)."""

    workspace: Path
    venvs_dir: Path | None = None
    mirrors: Mirrors | None = None


def mirrors_of(directory: str | Path | None, max_bytes: object = None) -> Mirrors | None:
    """The mirrors under `directory` with their size bound (default when absent); None without a directory."""
    if not directory:
        return None
    bound = max_bytes if isinstance(max_bytes, int) and not isinstance(max_bytes, bool) else DEFAULT_MAX_BYTES
    return Mirrors(Path(directory), max_bytes=bound)


def placement_of(envelope: bytes) -> Placement:
    """A `--wait` runner's first line: its workspace (created), venvs directory and mirrors.

    An agent from before the mirror sends no `mirrors`: that runner checks out directly.
    """
    where = json.loads(envelope)
    workspace = Path(where["workspace"]).resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    return Placement(
        workspace,
        Path(where["venvs"]) if where.get("venvs") else None,
        mirrors_of(where.get("mirrors"), where.get("mirror_max_bytes")),
    )
