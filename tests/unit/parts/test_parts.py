"""The typed registry of a server's parts (`conveyor.parts`): keys by identity, `need` for a wiring error."""

from __future__ import annotations

import pytest

from conveyor.errors import ConveyorError
from conveyor.parts import MissingPartError, PartKey, Parts


def test_a_part_is_found_by_its_key_and_only_by_it() -> None:
    first, twin = PartKey[int]("count"), PartKey[int]("count")
    parts = Parts()
    parts.put(first, 3)
    assert parts.get(first) == 3 and parts.need(first) == 3
    assert parts.get(twin) is None, "a key of the same name is another key"
    assert first in parts and twin not in parts
    parts.put(first, 4)
    assert parts.need(first) == 4 and parts.get(twin) is None


def test_needing_a_part_nobody_published_names_it() -> None:
    with pytest.raises(MissingPartError, match="no agent_hub part") as raised:
        Parts().need(PartKey[object]("agent_hub"))
    assert isinstance(raised.value, ConveyorError) and isinstance(raised.value, LookupError)
