"""Pure rules of dashboard sessions: the signed cookie, idle expiry, CSRF and sign-in throttling."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta

COOKIE_NAME = "conveyor_session"
CSRF_FIELD = "csrf_token"
TOUCH_INTERVAL = timedelta(minutes=1)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def new_session_secret() -> str:
    """32 random bytes, url-safe: the part of the cookie that identifies the session."""
    return _b64(secrets.token_bytes(32))


def new_csrf_token() -> str:
    """A per-session value every dashboard form must send back."""
    return secrets.token_hex(32)


def session_id(secret: str) -> str:
    """The stored key of a session: SHA-256 of its secret, so a database dump signs nobody in."""
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def sign_cookie(secret: str, key: bytes) -> str:
    """`<secret>.<HMAC-SHA256(key, secret)>`."""
    mac = hmac.new(key, secret.encode("ascii"), hashlib.sha256).digest()
    return f"{secret}.{_b64(mac)}"


def verify_cookie(value: str | None, key: bytes) -> str | None:
    """The session secret of a cookie signed with `key`, else None (absent, malformed or forged)."""
    if not value or value.count(".") != 1 or len(value) > 200:
        return None
    secret, _, mac_text = value.partition(".")
    try:
        given = _unb64(mac_text)
        secret.encode("ascii")
    except (ValueError, UnicodeEncodeError):
        return None
    expected = hmac.new(key, secret.encode("ascii"), hashlib.sha256).digest()
    return secret if hmac.compare_digest(given, expected) else None


def session_expired(last_seen_at: datetime, now: datetime, idle: timedelta) -> bool:
    """A session nobody used for `idle` is over."""
    return now - last_seen_at >= idle


def needs_touch(last_seen_at: datetime, now: datetime) -> bool:
    """`last_seen_at` is written at most once a minute."""
    return now - last_seen_at >= TOUCH_INTERVAL


def csrf_matches(expected: str, given: str | None) -> bool:
    """Constant-time comparison of a form's CSRF value with the session's."""
    return bool(given) and hmac.compare_digest(expected.encode(), (given or "").encode())


def origin_allowed(origin: str | None, own_origin: str) -> bool:
    """Whether a form post's `Origin` header (when the browser sent one) is this dashboard's own.

    `null` (a sandboxed frame, a `data:` page) and any other scheme, host or port are foreign.
    """
    return origin is None or origin == own_origin


def parse_cookie_header(header: str | None, name: str = COOKIE_NAME) -> str | None:
    """The value of cookie `name` in a `Cookie:` header."""
    if not header:
        return None
    for part in header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            return value.strip().strip('"')
    return None


@dataclass
class SignInThrottle:
    """At most `max_failures` failed sign-ins per remote address within `window_s`; then 429 until it passes."""

    max_failures: int
    window_s: float
    _failures: dict[str, deque[float]] = field(default_factory=dict)

    def _recent(self, remote: str, now: float) -> deque[float]:
        times = self._failures.setdefault(remote, deque())
        while times and now - times[0] >= self.window_s:
            times.popleft()
        return times

    def retry_after(self, remote: str, now: float) -> float | None:
        """Seconds until `remote` may try again, or None when it may try now."""
        times = self._recent(remote, now)
        if len(times) < self.max_failures:
            if not times:
                self._failures.pop(remote, None)
            return None
        return max(0.0, self.window_s - (now - times[0]))

    def failed(self, remote: str, now: float) -> None:
        """Count one failed attempt."""
        self._recent(remote, now).append(now)
        if len(self._failures) > 10_000:  # bound the memory an address sweep can take
            oldest = min(self._failures, key=lambda k: self._failures[k][-1] if self._failures[k] else 0)
            self._failures.pop(oldest, None)

    def succeeded(self, remote: str) -> None:
        """A good sign-in clears the address's count."""
        self._failures.pop(remote, None)
