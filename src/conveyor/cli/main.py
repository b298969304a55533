"""The top-level `conveyor` typer app."""

import typer

from conveyor.cli import admin, agent, authoring, run, server

app = typer.Typer(
    rich_markup_mode=None,
    name="conveyor",
    help="Conveyor: self-hosted CI/CD whose workflows are Python code.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
server.register(app)
authoring.register(app)
run.register(app)
agent.register(app)
app.add_typer(admin.app)


def main() -> None:
    """Console-script entry point."""
    app()
