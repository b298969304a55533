"""`queue_max_depth` decisions (pure)."""

from conveyor.execution.depth import queue_full_reason, room_left


def test_room_is_what_the_limit_leaves_and_never_negative() -> None:
    assert room_left(1000, 0) == 1000
    assert room_left(1000, 999) == 1
    assert room_left(1000, 1000) == 0
    assert room_left(2, 5) == 0


def test_the_reason_names_the_code_and_the_limit() -> None:
    assert queue_full_reason(2) == "queue_full: 2 jobs already pending (queue_max_depth)"
