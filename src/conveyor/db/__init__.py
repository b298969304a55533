"""Storage: engine factory, tables, migrations and dialect helpers."""

from conveyor.db.engine import Database, Dialect, dialect_of

__all__ = ["Database", "Dialect", "dialect_of"]
