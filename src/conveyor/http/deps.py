"""Admin route dependencies: `require(permission)`, the database, and in-transaction access logging."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from sqlalchemy.ext.asyncio import AsyncConnection

from conveyor.db.engine import Database
from conveyor.model.errors import ApiError
from conveyor.model.ids import new_id, utc_now
from conveyor.model.permissions import PERMISSIONS


@dataclass(frozen=True)
class Principal:
    """The caller of an admin route."""

    token_id: str
    label: str | None
    role: str
    routing_key: str | None

    @property
    def scoped(self) -> bool:
        """Whether the token is limited to one routing key."""
        return self.routing_key is not None

    def may_see(self, routing_key: str | None) -> bool:
        """Whether a row of `routing_key` is visible to this caller (a scoped token sees its key's alone)."""
        return not self.scoped or routing_key == self.routing_key

    def check_key(self, routing_key: str | None, verb: str) -> None:
        """Refuse (403 `token_scope`) an action on `routing_key` by a token scoped to another one."""
        if self.scoped and routing_key != self.routing_key:
            raise ApiError(403, "token_scope", f"this token may only {verb} {self.routing_key}")

    def scope_filter(self, asked: str | None, verb: str = "read") -> str | None:
        """The routing key a list or an action is limited to: the one asked for, or the token's own.

        A scoped token asking for another key is refused (403 `token_scope`); asking for none gets its own.
        """
        if not self.scoped:
            return asked
        if asked is not None:
            self.check_key(asked, verb)
        return self.routing_key


@dataclass(frozen=True)
class PermissionSpec:
    """What a route requires: one permission, and whether routing-key-scoped tokens may call it."""

    permission: str
    scoped: bool


@dataclass
class AccessEntry:
    """One access-log row before it is written (docs/design/admin.md §5)."""

    action: str
    outcome: str
    status_code: int
    source: str
    actor_type: str = "admin_token"
    actor_id: str | None = None
    actor_label: str | None = None
    actor_role: str | None = None
    permission: str | None = None
    target_type: str | None = None
    target_id: str | None = None
    routing_key: str | None = None
    request_id: str | None = None
    remote_addr: str | None = None
    error: str | None = None
    id: str = field(default_factory=new_id)
    at: Any = field(default_factory=utc_now)

    def as_row(self) -> dict[str, Any]:
        """Column values for `access_log`."""
        row = dict(self.__dict__)
        if row["error"] is not None:
            row["error"] = row["error"][:500]
        return row


def require(permission: str, *, scoped: bool = False) -> Callable[[Request], Awaitable[Principal]]:
    """Dependency declaring the route's one permission; returns the caller's `Principal`.

    The admin guard middleware has already authenticated and authorised the caller by the time this
    runs (before the body is read); the dependency is the declaration and the hand-over.
    """
    if permission not in PERMISSIONS:
        raise ValueError(f"unknown permission {permission!r}")

    async def dependency(request: Request) -> Principal:
        principal = getattr(request.state, "principal", None)
        if not isinstance(principal, Principal):  # only reachable if the guard is not installed
            raise ApiError(503, "auth_unavailable", "the admin guard is not active")
        return principal

    dependency.conveyor_permission = PermissionSpec(permission, scoped)  # type: ignore[attr-defined]
    return dependency


# Re-checks that a caller is still allowed in (its token live, its dashboard session open); set per
# request by the admin guard, called as a long response (a log stream) goes on.
AuthorisationCheck = Callable[[], Awaitable[bool]]


async def _always_authorised() -> bool:
    return True


def authorisation_check(request: Request) -> AuthorisationCheck:
    """The caller's re-check: a response that outlives its request ends once this answers False."""
    check = getattr(request.state, "authorisation_check", None)
    return check if callable(check) else _always_authorised


def database(request: Request) -> Database:
    """The process's database; 503 `unavailable` while it has not been opened."""
    db: Database | None = getattr(request.app.state, "db", None)
    if db is None:
        raise ApiError(503, "unavailable", "the database is not available yet")
    return db


# Writes a change's access-log row in the change's transaction, or raises `ApiError` 503 (nothing changes
# then). The admin guard hands it over with the request's entry: the access log is `admin`'s table, and
# this package sits below `admin` and runs no SQL of its own.
AccessLogWrite = Callable[[AsyncConnection, AccessEntry], Awaitable[None]]


async def log_write(
    request: Request,
    conn: AsyncConnection,
    *,
    target_type: str | None,
    target_id: str | None,
    status_code: int,
) -> None:
    """Write this request's access-log row inside the handler's transaction.

    A 2xx then means the change and its log row both committed; if the row cannot be written the
    change rolls back with it.
    """
    entry: AccessEntry | None = getattr(request.state, "access_entry", None)
    write: AccessLogWrite | None = getattr(request.state, "access_log_write", None)
    if entry is None or write is None:
        return
    entry.target_type, entry.target_id, entry.status_code = target_type, target_id, status_code
    await write(conn, entry)
    request.state.access_logged = True
