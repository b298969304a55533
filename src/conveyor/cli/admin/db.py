"""`conveyor admin db status|migrate` (work offline when given --database-url)."""

from __future__ import annotations

from typing import Annotated

import typer

from conveyor.cli.admin.client import EXIT_API, client_from, fail, print_fields, print_json

app = typer.Typer(rich_markup_mode=None, name="db", help="Database schema.", no_args_is_help=True)


@app.command("status")
def status(
    ctx: typer.Context,
    database_url: Annotated[
        str | None, typer.Option("--database-url", help="Read the database directly (server down).")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Current and head schema revisions."""
    if database_url:
        from conveyor.db.engine import dialect_of
        from conveyor.db.migrate import schema_status

        try:
            result = schema_status(database_url)
        except Exception as exc:
            fail(f"cannot read the schema of the database: {exc}", EXIT_API)
        body = {
            "dialect": dialect_of(database_url),
            "current": result.current,
            "head": result.head,
            "state": result.state,
        }
        client_json = json_output or client_from(ctx).options.json_output
    else:
        client = client_from(ctx, json_output)
        body = client.get("/db/status")
        client_json = client.options.json_output
    if client_json:
        print_json(body)
    else:
        print_fields(body)


@app.command("migrate")
def migrate(
    database_url: Annotated[
        str, typer.Option("--database-url", envvar="CONVEYOR_DATABASE_URL", help="The database to migrate.")
    ],
) -> None:
    """Offline: apply pending migrations (`alembic upgrade head`) under the migration lock."""
    from conveyor.db.migrate import MigrationError, upgrade_to

    try:
        result = upgrade_to(database_url)
    except MigrationError as exc:
        fail(str(exc), EXIT_API)
    except Exception as exc:
        fail(f"cannot migrate the database: {exc}", EXIT_API)
    typer.echo(f"database is at {result.current} (head {result.head})")
