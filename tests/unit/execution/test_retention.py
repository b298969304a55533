"""The retention cutoff (pure)."""

from datetime import UTC, datetime, timedelta

from conveyor.execution.retention import retention_cutoff

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def test_zero_days_keeps_forever() -> None:
    assert retention_cutoff(NOW, 0) is None


def test_the_cutoff_is_that_many_days_before_now() -> None:
    assert retention_cutoff(NOW, 1) == NOW - timedelta(days=1)
    assert retention_cutoff(NOW, 3650) == NOW - timedelta(days=3650)
