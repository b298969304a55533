"""How many bytes a job's cache restore wrote, read from its log."""

from __future__ import annotations

from tests.support.dispatch_stage import Stage
from tests.support.http import HTTP


def restored_bytes(s: Stage) -> float:
    """What the server served to restores (`conveyor_cache_restored_bytes_total`)."""
    text = HTTP.get(f"{s.server.url}/metrics", timeout=10).text
    line = next(
        (ln for ln in text.splitlines() if ln.startswith("conveyor_cache_restored_bytes_total ")), None
    )
    return 0.0 if line is None else float(line.split()[-1])
