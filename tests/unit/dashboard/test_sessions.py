"""Pure rules of dashboard sessions: cookie signing, expiry, CSRF, throttling."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from conveyor.dashboard import sessions


def test_a_signed_cookie_verifies_only_with_its_key_and_unchanged() -> None:
    secret = sessions.new_session_secret()
    key, other = b"k" * 32, b"o" * 32
    cookie = sessions.sign_cookie(secret, key)
    assert sessions.verify_cookie(cookie, key) == secret
    assert sessions.verify_cookie(cookie, other) is None
    tampered = ("A" if cookie[0] != "A" else "B") + cookie[1:]
    assert sessions.verify_cookie(tampered, key) is None
    assert sessions.verify_cookie(cookie[:-2], key) is None


@pytest.mark.parametrize("value", [None, "", "no-dot", "a.b.c", "é.x", "x." + "A" * 300, "abc.!!!"])
def test_malformed_cookies_are_refused(value: str | None) -> None:
    assert sessions.verify_cookie(value, b"k" * 32) is None


def test_session_ids_are_digests_of_distinct_secrets() -> None:
    first, second = sessions.new_session_secret(), sessions.new_session_secret()
    assert first != second
    assert sessions.session_id(first) != first and len(sessions.session_id(first)) == 64
    assert sessions.session_id(first) == sessions.session_id(first)


def test_idle_expiry_and_touch_interval() -> None:
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    idle = timedelta(hours=8)
    assert not sessions.session_expired(now - timedelta(hours=7, minutes=59), now, idle)
    assert sessions.session_expired(now - idle, now, idle)
    assert not sessions.needs_touch(now - timedelta(seconds=59), now)
    assert sessions.needs_touch(now - timedelta(seconds=60), now)


@pytest.mark.parametrize(
    ("given", "ok"), [("abc", True), ("abd", False), ("", False), (None, False), ("abcd", False)]
)
def test_csrf_matches_only_the_exact_value(given: str | None, ok: bool) -> None:
    assert sessions.csrf_matches("abc", given) is ok


@pytest.mark.parametrize(
    ("header", "found"),
    [
        (None, None),
        ("", None),
        ("conveyor_session=abc.def", "abc.def"),
        ("a=1; conveyor_session=x.y; b=2", "x.y"),
        ('conveyor_session="q.r"', "q.r"),
        ("xconveyor_session=nope", None),
    ],
)
def test_the_session_cookie_is_read_from_a_cookie_header(header: str | None, found: str | None) -> None:
    assert sessions.parse_cookie_header(header) == found


def test_sign_in_throttle_blocks_after_the_limit_until_the_window_passes() -> None:
    throttle = sessions.SignInThrottle(max_failures=3, window_s=60)
    for t in (0.0, 1.0, 2.0):
        assert throttle.retry_after("a", t) is None
        throttle.failed("a", t)
    assert throttle.retry_after("a", 3.0) == pytest.approx(57.0)
    assert throttle.retry_after("b", 3.0) is None  # per address
    assert throttle.retry_after("a", 60.5) is None  # the first failure left the window
    throttle.failed("a", 61.0)
    assert throttle.retry_after("a", 61.1) is None  # 2.0 and 61.0 are within the window: two of three
    throttle.failed("a", 61.2)
    assert throttle.retry_after("a", 61.5) is not None
    throttle.succeeded("a")
    assert throttle.retry_after("a", 61.5) is None


@pytest.mark.parametrize(
    ("origin", "ok"),
    [
        (None, True),
        ("http://conveyor.example:8470", True),
        ("https://conveyor.example:8470", False),
        ("http://conveyor.example", False),
        ("http://evil.example:8470", False),
        ("null", False),
        ("", False),
    ],
)
def test_a_form_is_accepted_only_without_an_origin_or_from_our_own(origin: str | None, ok: bool) -> None:
    assert sessions.origin_allowed(origin, "http://conveyor.example:8470") is ok
