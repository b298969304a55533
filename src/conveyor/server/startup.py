"""Bringing the database to a usable state at boot: reachability, migrations, the owner token.

Runs before the listener opens when the database answers, and again in the background until it
does, so a node whose database is down still serves `/health` and a `/ready` that says why.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import dataclass, field

from sqlalchemy.engine import make_url

from conveyor.admin.store import bootstrap_owner_token
from conveyor.db.engine import Database, check_reachable
from conveyor.db.migrate import MigrationError, SchemaStatus, schema_status, upgrade_to
from conveyor.runtime.node import FatalStartupError

log = logging.getLogger(__name__)


@dataclass
class StartupState:
    """What `/ready` reports about boot.

    `done`: the database is prepared. `started`: every start-up hook ran after that. The hooks run before
    the listener opens, unless one must wait long first (a crashed predecessor's identity row going stale,
    docs/design/cluster.md §1): it calls `listen_while`, the listener opens, and `/ready` names the wait.
    """

    done: bool = False
    detail: str = "starting"
    schema: SchemaStatus | None = None
    fatal: str | None = None
    owner_token_printed: bool = False
    hooks: list[object] = field(default_factory=list)
    started: bool = False
    waiting: str | None = None
    listen: asyncio.Event = field(default_factory=asyncio.Event)

    def listen_while(self, waiting: str) -> None:
        """A hook is about to wait for long: open the listener now, report `waiting` in `/ready`."""
        self.waiting = waiting
        self.listen.set()

    def readiness(self) -> tuple[bool, str]:
        """(ok, detail) of `/ready`'s `startup` check."""
        if self.done and not self.started and self.fatal is None:
            return False, self.waiting or "starting the node's services"
        return self.done and self.started, self.detail


def redact_url(url: str) -> str:
    """A database URL without its password, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable database url>"


def print_owner_banner(token: str, url: str) -> None:
    """Print the first owner token once, framed, on stderr (outside the structured log)."""
    lines = [
        "Conveyor created the first owner admin token. It is shown only this once:",
        "",
        f"    {token}",
        "",
        "Use it with:  export CONVEYOR_TOKEN=<token>   (and CONVEYOR_URL=" + url + ")",
        "Lost it? `conveyor admin token bootstrap --database-url …` mints another.",
    ]
    width = max(len(line) for line in lines) + 4
    border = "+" + "-" * (width - 2) + "+"
    out = [border] + [f"| {line.ljust(width - 4)} |" for line in lines] + [border]
    sys.stderr.write("\n".join(out) + "\n")
    sys.stderr.flush()


async def prepare_database(
    db: Database, *, migrate: bool, public_url: str, state: StartupState, timeout_s: float
) -> None:
    """Migrate (or refuse an old schema), then bootstrap the owner token. Raises when not done.

    `FatalStartupError` means retrying cannot help; other exceptions mean the database is not
    reachable yet.
    """
    await check_reachable(db, timeout_s)
    url = db.url
    status = await asyncio.to_thread(schema_status, url)
    if status.state in ("behind", "empty"):
        if not migrate:
            raise FatalStartupError(
                f"the database schema is behind this build ({status.describe()}); run "
                f"`conveyor admin db migrate --database-url {redact_url(url)}` first, or start without --no-migrate"
            )
        try:
            status = await asyncio.to_thread(upgrade_to, url)
        except MigrationError as exc:
            state.schema = status
            log.error("migration refused: %s", exc)
            return
        log.info("database migrated", extra={"detail": status.describe()})
    state.schema = status
    if status.state == "ahead":
        # A newer node upgraded the schema: stay up, report not ready (docs/design/admin.md §8).
        log.error("database schema is newer than this build (%s)", status.describe())
        state.done, state.detail = True, "schema newer than this build"
        return
    async with db.transaction() as conn:
        token = await bootstrap_owner_token(conn)
    if token is not None:
        print_owner_banner(token, public_url)
        state.owner_token_printed = True
        log.info("admin.bootstrap_token_created", extra={"prefix": token[:16]})
    state.done, state.detail = True, "recovery finished"
