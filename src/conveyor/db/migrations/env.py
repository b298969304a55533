"""Alembic environment: always run programmatically on a connection handed in by `conveyor.db.migrate`."""

from alembic import context

from conveyor.db.tables import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    transaction_per_migration=False,
)
with context.begin_transaction():
    context.run_migrations()
