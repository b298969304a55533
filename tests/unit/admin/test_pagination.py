"""Opaque keyset cursors: they round-trip, and refuse tampering or reuse with other filters."""

from datetime import UTC, datetime

import pytest

from conveyor.admin.pagination import check_limit, decode_cursor, encode_cursor
from conveyor.model.errors import ApiError

AT = datetime(2025, 3, 1, 12, 0, 0, 123000, tzinfo=UTC)


def test_cursor_round_trips() -> None:
    cursor = encode_cursor(AT, "row-1", {"outcome": "denied"})
    assert decode_cursor(cursor, {"outcome": "denied"}) == (AT, "row-1")


def test_cursor_reused_with_other_filters_is_refused() -> None:
    cursor = encode_cursor(AT, "row-1", {"outcome": "denied"})
    with pytest.raises(ApiError) as info:
        decode_cursor(cursor, {"outcome": "allowed"})
    assert (info.value.status, info.value.code) == (400, "invalid_cursor")


@pytest.mark.parametrize("cursor", ["", "not-base64!!", "eyJ2IjoyfQ", "bnVsbA"])
def test_tampered_cursor_is_refused(cursor: str) -> None:
    with pytest.raises(ApiError) as info:
        decode_cursor(cursor, {})
    assert info.value.code == "invalid_cursor"


@pytest.mark.parametrize("limit", [0, -1, 501])
def test_limit_outside_1_to_500_is_refused(limit: int) -> None:
    with pytest.raises(ApiError) as info:
        check_limit(limit)
    assert info.value.status == 400
