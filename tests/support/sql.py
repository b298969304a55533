"""SQL against a test's database on a connection of the test's own (SQLite or PostgreSQL)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from conveyor.db.engine import create_sync_engine


def query(database_url: str, sql: str, **params: Any) -> list[dict[str, Any]]:
    """Run one statement in its own committed transaction; its rows as dicts ([] when it returns none)."""
    engine = create_sync_engine(database_url)
    try:
        with engine.begin() as conn:
            result = conn.execute(text(sql), params)
            return [dict(row._mapping) for row in result] if result.returns_rows else []
    finally:
        engine.dispose()
