"""Processing state, derived and never stored (docs/design/events.md §4): one pure function and one SQL
expression."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import and_, case, literal
from sqlalchemy.sql.elements import ColumnElement

from conveyor.db.tables import events
from conveyor.events.models import ProcessingState


def processing_state(row: Mapping[str, Any], now: datetime) -> ProcessingState:
    """dlq > processed > leased > retrying > pending."""
    if row["dlq_at"] is not None:
        return "dlq"
    if row["processed_at"] is not None:
        return "processed"
    if (
        row["lease_owner"] is not None
        and row["lease_expires_at"] is not None
        and row["lease_expires_at"] > now
    ):
        return "leased"
    if row["attempts"] > 0:
        return "retrying"  # an attempt failed or its lease lapsed
    return "pending"


def state_expression(now: datetime) -> ColumnElement[str]:
    """The same rule as SQL, for the list filter."""
    c = events.c
    return case(
        (c.dlq_at.is_not(None), literal("dlq")),
        (c.processed_at.is_not(None), literal("processed")),
        (and_(c.lease_owner.is_not(None), c.lease_expires_at > now), literal("leased")),
        (c.attempts > 0, literal("retrying")),
        else_=literal("pending"),
    )
