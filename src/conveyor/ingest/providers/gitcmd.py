"""Running git as a subprocess (async), with errors that say what failed."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from conveyor.errors import ConveyorError


class GitError(ConveyorError):
    """A git command failed; the message carries its stderr."""


async def run_git(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> bytes:
    """Run `git ARGS`; return stdout, raise `GitError` on a non-zero exit."""
    environ = {**os.environ, "GIT_TERMINAL_PROMPT": "0", **(env or {})}
    process = await asyncio.create_subprocess_exec(
        "git",
        *args,
        cwd=cwd,
        env=environ,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await process.communicate()
    if process.returncode != 0:
        raise GitError(f"git {args[0]} failed: {stderr.decode(errors='replace').strip()[:500]}")
    return stdout


async def lock_blob_size(spec: str, cwd: Path, env: dict[str, str] | None = None) -> int | None:
    """`git cat-file -s <sha>:<path>`: the blob's size, None when the commit has no such file."""
    try:
        out = await run_git("cat-file", "-s", "--end-of-options", spec, cwd=cwd, env=env)
    except GitError as exc:
        text = str(exc)
        if "does not exist" in text or "exists on disk, but not in" in text or "Not a valid object" in text:
            return None
        raise
    return int(out.decode().strip())
