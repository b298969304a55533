"""Dashboard sessions as a service: sign in, resolve a cookie to a principal on every request, sign out."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import timedelta

from conveyor.admin.store import find_token_by_hash
from conveyor.admin.tokens import hash_token, looks_like_admin_token
from conveyor.dashboard import sessions, store
from conveyor.db.engine import Database
from conveyor.errors import ConveyorError
from conveyor.http.deps import Principal
from conveyor.model.ids import utc_now

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Session:
    """A signed-in browser, resolved on this request."""

    id: str
    csrf_token: str
    principal: Principal


class SignInRefused(ConveyorError):
    """The pasted token does not sign anyone in (unknown, revoked, expired or malformed)."""


class DashboardSessions:
    """Everything the dashboard and the admin guard need to know about sessions."""

    def __init__(self, db: Database, *, idle_ms: int, max_failures: int, window_ms: int) -> None:
        self._db = db
        self.idle = timedelta(milliseconds=idle_ms)
        self.throttle = sessions.SignInThrottle(max_failures=max_failures, window_s=window_ms / 1000)
        self._key: bytes | None = None
        self._key_lock = asyncio.Lock()

    async def key(self) -> bytes:
        """The shared signing key, read (or created) once per process."""
        if self._key is None:
            async with self._key_lock:
                if self._key is None:
                    async with self._db.transaction() as conn:
                        self._key = await store.session_key(conn, utc_now())
        return self._key

    async def sign_in(self, token: str, remote: str | None) -> tuple[str, Session]:
        """A new session for a live admin token: (cookie value, session). Raises `SignInRefused`."""
        token = token.strip()
        if not looks_like_admin_token(token):
            raise SignInRefused("that is not an admin token (they start with cvy_admin_)")
        now = utc_now()
        async with self._db.transaction() as conn:
            row = await find_token_by_hash(conn, hash_token(token))
            if row is None or not row.is_live(now):
                raise SignInRefused("the token is unknown, revoked or expired")
            await store.delete_idle_sessions(conn, now - self.idle)
            secret = sessions.new_session_secret()
            csrf = sessions.new_csrf_token()
            sid = sessions.session_id(secret)
            await store.insert_session(
                conn, sid=sid, token_id=row.id, csrf_token=csrf, now=now, remote=remote
            )
        principal = Principal(token_id=row.id, label=row.label, role=row.role, routing_key=row.routing_key)
        return sessions.sign_cookie(secret, await self.key()), Session(sid, csrf, principal)

    async def resolve(self, cookie: str | None) -> Session | None:
        """The session of a cookie, with its token checked now; None signs the browser out.

        A revoked or expired token, or a session idle too long, deletes the session row.
        """
        if not cookie:
            return None
        secret = sessions.verify_cookie(cookie, await self.key())
        if secret is None:
            return None
        sid = sessions.session_id(secret)
        now = utc_now()
        async with self._db.read() as conn:
            row = await store.find_session(conn, sid)
        if row is None:
            return None
        if not row.token_live(now) or sessions.session_expired(row.last_seen_at, now, self.idle):
            await self.end(sid)
            return None
        if sessions.needs_touch(row.last_seen_at, now):
            async with self._db.transaction() as conn:
                await store.touch_session(conn, sid, now)
        assert row.role is not None
        principal = Principal(
            token_id=row.token_id, label=row.label, role=row.role, routing_key=row.routing_key
        )
        return Session(sid, row.csrf_token, principal)

    async def end(self, sid: str) -> None:
        """Sign one session out."""
        async with self._db.transaction() as conn:
            await store.delete_session(conn, sid)

    async def principal_for_cookie_header(self, header: str | None) -> Principal | None:
        """For the admin guard: the principal of the `Cookie:` header's session, if any."""
        session = await self.resolve(sessions.parse_cookie_header(header))
        return session.principal if session else None

    def retry_after(self, remote: str) -> float | None:
        """Seconds `remote` must wait before another sign-in attempt."""
        return self.throttle.retry_after(remote, time.monotonic())

    def failed(self, remote: str) -> None:
        """Count a failed sign-in of `remote`."""
        self.throttle.failed(remote, time.monotonic())

    def succeeded(self, remote: str) -> None:
        """Clear `remote`'s failures."""
        self.throttle.succeeded(remote)

    async def prune(self) -> int:
        """Delete sessions idle past the limit (the retention sweep calls this)."""
        async with self._db.transaction() as conn:
            return await store.delete_idle_sessions(conn, utc_now() - self.idle)
