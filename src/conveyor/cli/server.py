"""`conveyor server` and `conveyor up`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

ConfigOption = Annotated[
    Path | None, typer.Option("--config", envvar="CONVEYOR_CONFIG", help="YAML file of settings.")
]
HostOption = Annotated[str | None, typer.Option("--host", help="Address to listen on (CONVEYOR_HOST).")]
PortOption = Annotated[int | None, typer.Option("--port", help="Port to listen on (CONVEYOR_PORT).")]


def _load(config: Path | None, overrides: dict[str, Any]) -> Any:
    from conveyor.server.config import ConfigError, load_settings

    try:
        return load_settings(
            config_file=config, overrides={k: v for k, v in overrides.items() if v is not None}
        )
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def _lock_home(settings: Any) -> tuple[Any, Any, Any]:
    """Before anything is created: refuse a home another server holds and a port that cannot be listened
    on (each exits 2 with one line saying what to do); then take `$CONVEYOR_HOME`'s lock. Returns the
    settings (with the port the kernel chose for `--port 0`), the lock and the bound listening socket."""
    from conveyor.server.home_lock import HomeHeld, acquire_home_lock, peek_home_lock
    from conveyor.server.listener import PortUnavailable, bind_listener

    held = peek_home_lock(settings.home)
    if held is not None:
        typer.echo(f"error: {held.message(settings.home)}", err=True)
        raise typer.Exit(2)
    try:
        listener = bind_listener(settings.host, settings.port)
    except PortUnavailable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if settings.port == 0:
        settings = settings.model_copy(update={"port": listener.getsockname()[1]})
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    lock = acquire_home_lock(settings.home, settings.public_url or f"http://{host}:{settings.port}")
    if isinstance(lock, HomeHeld):
        listener.close()
        typer.echo(f"error: {lock.message(settings.home)}", err=True)
        raise typer.Exit(2)
    return settings, lock, listener


def server(
    host: HostOption = None,
    port: PortOption = None,
    config: ConfigOption = None,
    no_migrate: Annotated[
        bool, typer.Option("--no-migrate", help="Refuse to start on an older schema instead of migrating it.")
    ] = False,
    role: Annotated[
        str | None,
        typer.Option("--role", help="coordinator (the default) or worker (CONVEYOR_CLUSTER_ROLE)."),
    ] = None,
    coordinator: Annotated[
        str | None,
        typer.Option(
            "--coordinator",
            help="A worker's coordinators, URL[,URL…] (CONVEYOR_CLUSTER_COORDINATOR_URLS).",
        ),
    ] = None,
) -> None:
    """Run the orchestrator."""
    settings = _load(
        config,
        {
            "host": host,
            "port": port,
            "no_migrate": no_migrate or None,
            "cluster_role": role,
            "cluster_coordinator_urls": coordinator,
        },
    )
    settings, lock, listener = _lock_home(settings)
    from conveyor.server.run import run

    raise typer.Exit(run(settings, lock, listener))


def up(host: HostOption = None, port: PortOption = None, config: ConfigOption = None) -> None:
    """All-in-one first run: the orchestrator on the embedded database in $CONVEYOR_HOME."""
    settings = _load(config, {"host": host, "port": port, "no_migrate": False, "scaler_builtin_local": True})
    settings, lock, listener = _lock_home(settings)
    from conveyor.server.run import run

    raise typer.Exit(run(settings, lock, listener))


def register(app: typer.Typer) -> None:
    """Attach `server` and `up`."""
    app.command("server")(server)
    app.command("up")(up)
