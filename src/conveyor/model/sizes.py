"""Byte counts as people read them (the CLI's tables and the dashboard's pages)."""

from __future__ import annotations


def size_text(size: int) -> str:
    """`512 B`, `1.5 KiB`, `48.0 MiB`, `5120.0 GiB`: read at a glance; the API has the exact bytes."""
    if size < 1024:
        return f"{size} B"
    value = size / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
