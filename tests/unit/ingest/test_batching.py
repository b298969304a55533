"""The group-commit batching decision: how many waiting deliveries the next commit takes."""

from hypothesis import given
from hypothesis import strategies as st

from conveyor.ingest.batching import take_batch


def test_nothing_waiting_takes_nothing() -> None:
    assert take_batch([], max_rows=10, max_bytes=100) == 0


def test_everything_waiting_that_fits_goes_in_one_commit() -> None:
    assert take_batch([10, 20, 30], max_rows=10, max_bytes=100) == 3


def test_the_row_bound_caps_a_batch() -> None:
    assert take_batch([1] * 50, max_rows=16, max_bytes=10_000) == 16


def test_the_byte_bound_stops_before_the_delivery_that_would_cross_it() -> None:
    assert take_batch([40, 40, 40, 1], max_rows=10, max_bytes=100) == 2


def test_a_delivery_bigger_than_the_byte_bound_still_commits_alone() -> None:
    assert take_batch([500, 1], max_rows=10, max_bytes=100) == 1


@given(
    st.lists(st.integers(min_value=0, max_value=1_000), max_size=60),
    st.integers(min_value=1, max_value=20),
    st.integers(min_value=1, max_value=3_000),
)
def test_a_batch_is_the_longest_prefix_within_both_bounds_and_never_empty(
    sizes: list[int], max_rows: int, max_bytes: int
) -> None:
    taken = take_batch(sizes, max_rows=max_rows, max_bytes=max_bytes)
    assert (taken == 0) == (not sizes)
    assert taken <= max_rows
    if taken > 1:
        assert sum(sizes[:taken]) <= max_bytes
    if 0 < taken < len(sizes) and taken < max_rows:
        assert sum(sizes[: taken + 1]) > max_bytes
