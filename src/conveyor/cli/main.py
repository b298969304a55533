"""The top-level `conveyor` typer app."""

import sys
from collections.abc import Sequence
from typing import Any

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
        add_completion=False,
    )
    server.register(root)
    authoring.register(root)
    run.register(root)
    agent.register(root)
    root.add_typer(admin_app(wanted_groups(args)))
    return root


def __getattr__(name: str) -> Any:
    # `from conveyor.cli.main import app` (tests, embedding): the whole app, built on first use only, so
    # importing this module stays cheap for the console script.
    if name == "app":
        built = globals()["app"] = build_app()
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Console-script entry point."""
    build_app(sys.argv[1:])()
