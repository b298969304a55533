"""Shared domain vocabulary: ids, timestamps, statuses, protocol messages."""

from conveyor.model.ids import new_id, utc_now

__all__ = ["new_id", "utc_now"]
