"""The top-level `conveyor` typer app."""

import os
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from conveyor.cli import agent, authoring, run, server
from conveyor.cli.admin import admin_app, wanted_groups


def build_app(args: Sequence[str] | None = None) -> typer.Typer:
    """The `conveyor` app for a command line: every command, with only the admin groups `args` needs
    (all of them when `args` is None)."""
    root = typer.Typer(
        rich_markup_mode=None,
        name="conveyor",
        help="Conveyor: self-hosted CI/CD whose workflows are Python code.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        # `--install-completion` / `--show-completion` (bash, zsh, fish, PowerShell), typer's way.
        add_completion=True,
    )
    root.callback()(_root_options)
    server.register(root)
    authoring.register(root)
    run.register(root)
    agent.register(root)
    root.add_typer(admin_app(wanted_groups(args)))
    return root


def _show_version(value: bool) -> None:
    if value:
        from conveyor.version import VERSION

        typer.echo(f"conveyor {VERSION}")
        raise typer.Exit()


def _root_options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Conveyor: self-hosted CI/CD whose workflows are Python code."""


def __getattr__(name: str) -> Any:
    # `from conveyor.cli.main import app` (tests, embedding): the whole app, built on first use only, so
    # importing this module stays cheap for the console script.
    if name == "app":
        built = globals()["app"] = build_app()
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Console-script entry point."""
    # Shell completion runs the program with no arguments and the words in the environment: it needs
    # every command, not only those of the (empty) command line.
    completing = any(key.startswith("_CONVEYOR_COMPLETE") for key in os.environ)
    build_app(None if completing else sys.argv[1:])(prog_name="conveyor")
