"""Running a server process: pre-flight, uvicorn, graceful shutdown, exit code."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import uvicorn

from conveyor.cluster.drain import on_shutdown_signal, run_worker_shutdown
from conveyor.db.engine import Database
from conveyor.heap import freeze_startup_heap
from conveyor.runtime.node import FatalStartupError
from conveyor.server.app import create_app, public_url
from conveyor.server.config import Settings, trusted_proxy_entries
from conveyor.server.home_lock import HomeHeld, HomeLock, acquire_home_lock
from conveyor.server.http_protocol import header_deadline_protocol
from conveyor.server.logs import configure_logging
from conveyor.server.metrics import Metrics
from conveyor.server.startup import prepare_database
from conveyor.server.state import ServerState
from conveyor.version import VERSION

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn's server with our signal handling: SIGTERM/SIGINT shut down gracefully and exit 0.

    uvicorn re-raises the caught signal after shutdown, which would make a clean stop look like a
    crash to supervisors; a second signal forces the exit. `on_listening` runs once the port is bound.
    """

    on_listening: Callable[[], None] | None = None
    # Called on each SIGTERM/SIGINT with whether it is the first (drain at once; the second forces).
    on_signal: Callable[[bool], None] | None = None
    # Work that must finish while the server still serves (a worker's running jobs report through its
    # agents' sockets, which uvicorn closes as soon as it starts shutting down): run on the first
    # signal, and only then does uvicorn shut down. A second signal shuts down at once.
    before_exit: Callable[[], Awaitable[None]] | None = None
    _signals: int = 0
    _before_exit_task: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._signals += 1
        first = self._signals == 1
        if first and self.before_exit is not None:
            if self.on_signal is not None:
                self.on_signal(True)
            self._before_exit_task = asyncio.get_running_loop().create_task(
                self._exit_after(self.before_exit), name="before-exit"
            )
            return
        super().handle_exit(sig, frame)
        if not first:
            self.force_exit = True  # uvicorn forces only on a second SIGINT; a second SIGTERM does too
        if self.on_signal is not None:
            self.on_signal(first)

    async def _exit_after(self, work: Callable[[], Awaitable[None]]) -> None:
        try:
            await work()
        except Exception:
            log.exception("the shutdown work failed; shutting down anyway")
        self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit and self.on_listening is not None:
            self.on_listening()

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)


def private_home(home: Path, database_file: Path | None) -> None:
    """Create the home 0700 and the embedded database file 0600 before SQLite opens it (its -wal and
    -shm files take the database file's mode): tokens, secrets and logs live there."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    if home.stat().st_uid == os.getuid():
        home.chmod(0o700)
    if database_file is None:
        return
    fd = os.open(database_file, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    for path in (database_file, *(database_file.with_name(database_file.name + s) for s in ("-wal", "-shm"))):
        if path.exists():
            path.chmod(0o600)


def build_state(settings: Settings) -> ServerState:
    """Create the process's state (the database engine opens connections lazily; a worker never opens one)."""
    worker = settings.cluster_role == "worker"
    private_home(
        settings.home, settings.sqlite_path if settings.database_url is None and not worker else None
    )
    db = Database.connect(
        settings.effective_database_url,
        pool_size=settings.db_pool_size,
        connect_timeout_s=settings.ready_db_timeout_ms / 1000,
    )
    return ServerState(settings=settings, db=db, metrics=Metrics(role=settings.cluster_role))


async def serve(
    settings: Settings, home_lock: HomeLock | None = None, listener: socket.socket | None = None
) -> int:
    """Run until SIGTERM/SIGINT; return the process exit code (2 at once when the home is held).

    `listener`: the socket already bound for `settings.host:port` (`conveyor.server.listener`), else
    uvicorn binds one."""
    lock = home_lock or acquire_home_lock(settings.home, public_url(settings))
    if isinstance(lock, HomeHeld):
        sys.stderr.write(f"error: {lock.message(settings.home)}\n")
        return 2
    try:
        return await _serve_locked(settings, listener)
    finally:
        lock.release()
        if listener is not None:
            listener.close()


async def _serve_locked(settings: Settings, listener: socket.socket | None) -> int:
    state = build_state(settings)
    state.home_locked = True
    log.info(
        "server.build_info",
        extra={"version": VERSION, "role": settings.cluster_role, "database": state.db.dialect},
    )
    try:
        if settings.cluster_role == "worker":
            # A worker has no database (docs/design/cluster.md §1): nothing to migrate, its start-up hooks
            # only dial.
            state.startup.done, state.startup.detail = True, "worker: no database"
        else:
            await prepare_database(
                state.db,
                migrate=not settings.no_migrate,
                public_url=public_url(settings),
                state=state.startup,
                timeout_s=settings.ready_db_timeout_ms / 1000,
            )
    except FatalStartupError as exc:
        await state.db.dispose()
        sys.stderr.write(f"error: {exc}\n")
        return 1
    except Exception as exc:  # unreachable database: serve probes and keep retrying in the background
        state.startup.detail = f"waiting for the database: {exc}"[:300]
        log.warning("database not reachable at boot, will retry: %s", exc)

    app = create_app(state)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        ws="websockets-sansio",
        http=header_deadline_protocol(settings.http_header_timeout_ms / 1000),
        # X-Forwarded-For/-Proto only from CONVEYOR_TRUSTED_PROXIES (uvicorn trusts loopback by default,
        # which let any local client choose the address the sign-in and claim throttles count).
        proxy_headers=bool(trusted_proxy_entries(settings.trusted_proxies)),
        forwarded_allow_ips=trusted_proxy_entries(settings.trusted_proxies),
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=max(1, settings.shutdown_grace_ms // 1000),
    )
    server = _Server(config)
    fatal: list[str] = []

    def fatal_exit(message: str) -> None:
        fatal.append(message)
        server.should_exit = True

    state.fatal_exit = fatal_exit

    def listening() -> None:
        # The app is started: what exists now lives as long as the process. No collection first: a full
        # one blocks the loop long enough on a loaded machine for the leader lease to lapse.
        freeze_startup_heap()
        url = public_url(settings)
        if settings.cluster_role == "worker":
            sys.stderr.write(
                f"conveyor {VERSION} worker listening on {url}; it runs jobs its coordinators reroute to it\n"
            )
        else:
            sys.stderr.write(
                f"conveyor {VERSION} listening on {url} ({state.db.dialect}); dashboard: {url}/ui\n"
            )
        sys.stderr.flush()

    server.on_listening = listening
    server.on_signal = lambda first: on_shutdown_signal(state.parts, first=first)
    if settings.cluster_role == "worker":
        server.before_exit = lambda: run_worker_shutdown(state.parts)
    await server.serve(sockets=[listener] if listener is not None else None)
    if fatal:
        sys.stderr.write(f"error: {fatal[0]}\n")
        return 1
    return 0 if server.started else 1


def run(settings: Settings, home_lock: HomeLock | None = None, listener: socket.socket | None = None) -> int:
    """Configure logging and run the server to completion."""
    configure_logging(settings.log_format, settings.log_level, keep_recent=True)
    return asyncio.run(serve(settings, home_lock, listener))
