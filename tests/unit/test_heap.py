"""Start-up objects are moved out of the collector's reach (see conveyor.heap)."""

from __future__ import annotations

import gc
import subprocess
import sys

from conveyor.heap import freeze_startup_heap


def test_freezing_leaves_later_full_collections_only_the_new_objects() -> None:
    try:
        freeze_startup_heap(collect=True)
        frozen = gc.get_freeze_count()
        assert frozen > 0
        assert all(count == 0 for count in gc.get_count()[1:]), "the older generations were emptied"
    finally:
        gc.unfreeze()


def test_the_cheap_form_freezes_without_collecting_first() -> None:
    """As agents, runners and step processes use it: no full-heap pause on their way to `ready`."""
    probe = (
        "import gc\n"
        "from conveyor.heap import freeze_startup_heap\n"
        "before = gc.get_freeze_count()\n"
        "freeze_startup_heap()\n"
        "assert before == 0 and gc.get_freeze_count() > 0\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
