"""Which database errors the agent hub retries (deadlocks, serialisation failures, SQLite's busy lock)."""

import pytest
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from conveyor.db.engine import is_transient


class PgError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"sqlstate {sqlstate}")
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("orig", "expected"),
    [
        (PgError("40P01"), True),  # deadlock detected
        (PgError("40001"), True),  # serialization failure
        (PgError("55P03"), True),  # lock not available
        (PgError("23505"), False),  # unique violation: a retry changes nothing
        (PgError("42P01"), False),  # undefined table
        (Exception("database is locked"), True),  # SQLite busy writer
        (Exception("no such table: jobs"), False),
    ],
)
def test_only_aborted_transactions_are_retried(orig: Exception, expected: bool) -> None:
    assert is_transient(OperationalError("UPDATE jobs …", {}, orig)) is expected


def test_a_pool_timeout_is_retried() -> None:
    assert is_transient(PoolTimeout("QueuePool limit of size 10 overflow 10 reached")) is True
