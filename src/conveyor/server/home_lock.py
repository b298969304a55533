"""An exclusive lock on `$CONVEYOR_HOME` for a server process's whole life (decisions.md).

The lock is `flock(2)` on `$CONVEYOR_HOME/server.lock`, held through an open file descriptor: the kernel
releases it when the process ends, crash or not. The file holds the holder's pid and URL so a second
`conveyor up`/`server` on the same home can say who is in the way and exit at once. A free lock on a home
whose SQLite database still has a live instance row means the predecessor crashed: no stale-window wait.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

LOCK_FILE = "server.lock"


@dataclass(frozen=True)
class HomeHeld:
    """Another process holds the home: its pid and URL as it wrote them (None when unreadable)."""

    path: Path
    pid: int | None
    url: str | None

    def message(self, home: Path) -> str:
        """The one line a refused process prints."""
        who = f"pid {self.pid}" if self.pid is not None else "another process"
        where = f" (serving {self.url})" if self.url else ""
        return (
            f"CONVEYOR_HOME {home} is in use by conveyor {who}{where}; stop it first, "
            "or give this process its own CONVEYOR_HOME"
        )


def parse_holder(text: str) -> tuple[int | None, str | None]:
    """`<pid> <url>` as the holder wrote it; (None, None) for anything else."""
    parts = text.split()
    if len(parts) < 1 or not parts[0].isdigit():
        return None, None
    return int(parts[0]), parts[1] if len(parts) > 1 else None


class HomeLock:
    """The held lock; `release` (or process exit) frees it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Unlock and close (idempotent)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def peek_home_lock(home: Path) -> HomeHeld | None:
    """Who holds the home's lock, without creating anything (None when nobody does or it never existed)."""
    path = home / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            pid, holder_url = parse_holder(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            pid, holder_url = None, None
        return HomeHeld(path, pid, holder_url)
    finally:
        os.close(fd)  # closing drops a shared lock taken above
    return None


def acquire_home_lock(home: Path, url: str) -> HomeLock | HomeHeld:
    """Take the home's lock without blocking and record our pid and URL; or say who holds it."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = home / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        try:
            pid, holder_url = parse_holder(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            pid, holder_url = None, None
        return HomeHeld(path, pid, holder_url)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} {url}\n".encode())
    return HomeLock(path, fd)
