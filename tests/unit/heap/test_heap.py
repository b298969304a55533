"""Start-up objects are moved out of the collector's reach (see conveyor.heap)."""

from __future__ import annotations

import gc
import subprocess
import sys

from conveyor.heap import freeze_startup_heap


def test_freezing_leaves_later_full_collections_only_the_new_objects() -> None:
    before = ["allocated", "before", "the", "freeze"]
    try:
        freeze_startup_heap()
        after = ["allocated", "after", "the", "freeze"]
        assert gc.get_freeze_count() > 0
        tracked = gc.get_objects()  # what a full collection scans
        assert not any(o is before for o in tracked), "an object from before the freeze is still scanned"
        assert any(o is after for o in tracked), "a later object escapes the collector"
    finally:
        gc.unfreeze()


def test_a_fresh_process_freezes_its_start_up_objects() -> None:
    """As the server, agents, runners and step processes use it, at the end of their start-up."""
    probe = (
        "import gc\n"
        "from conveyor.heap import freeze_startup_heap\n"
        "before = gc.get_freeze_count()\n"
        "freeze_startup_heap()\n"
        "assert before == 0 and gc.get_freeze_count() > 0\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
