"""Deliveries hold event names, actions and delivery ids up to the 256 characters ingest accepts.

SQLite does not enforce VARCHAR lengths, so only PostgreSQL's columns change (a batch copy of a
large `deliveries` table on SQLite would buy nothing).

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"

WIDENED = {"delivery_id": 200, "event": 100, "action": 100}


def _alter(to_new: bool) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name, old in WIDENED.items():
        op.alter_column(
            "deliveries",
            name,
            type_=sa.String(length=256 if to_new else old),
            existing_type=sa.String(length=old if to_new else 256),
            existing_nullable=name == "action",
        )


def upgrade() -> None:
    _alter(True)


def downgrade() -> None:
    _alter(False)
