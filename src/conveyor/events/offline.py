"""`conveyor admin registration register-manual --database-url URL`: a manual registration written straight into
the database, for an orchestrator that is down (docs/design/events.md §7).

It writes through the route's own function (`registrations.register_manual`), so the rows are the ones the
admin route writes, plus an access-log row with `source=cli_offline` as `token bootstrap` writes one.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError

from conveyor.admin.offline import OfflineError, log_offline_action, offline_transaction
from conveyor.errors import ConveyorError
from conveyor.events.models import EventSettings
from conveyor.events.registrations import SyncResult, register_manual
from conveyor.lockfile import LockReadError, parse_lock


class InvalidLockFile(ConveyorError, ValueError):
    """The lock file given is not a valid lock (the route's 400 `invalid_lock_file`)."""


async def register_manual_offline(
    database_url: str,
    *,
    routing_key: str,
    repo: str,
    lock_bytes: bytes,
    commit_sha: str | None = None,
    default_branch: str | None = None,
    only: Sequence[str] | None = None,
) -> SyncResult:
    """Register the lock's workflows for (routing key, repo) in the database at `database_url`.

    Raises `InvalidLockFile`, `registrations.UnknownRoutingKey`, or `OfflineError` (unreachable, not migrated).
    """
    try:
        lock = parse_lock(lock_bytes)
    except (LockReadError, ValidationError) as exc:
        raise InvalidLockFile(str(exc)) from exc
    async with offline_transaction(database_url) as conn:
        # The stored event (`conveyor.registration.updated`) is checked against the built-in event limits:
        # no orchestrator's settings are at hand, and the payload is small.
        result = await register_manual(
            conn,
            routing_key=routing_key,
            repo=repo,
            lock=lock,
            commit_sha=commit_sha,
            default_branch=default_branch,
            only=only,
            settings=EventSettings(),
        )
        await log_offline_action(
            conn,
            action="registrations.manual",
            status_code=200,
            permission="registration.manage",
            target_type="registration",
            target_id=repo,
        )
    return result


__all__ = ["InvalidLockFile", "OfflineError", "register_manual_offline"]
