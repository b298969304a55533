"""`event_log_max_payload_bytes` and the content and lock-file cache knobs in `cluster_settings` (docs/design/execution.md §1.1).

Revision ID: 0024
Revises: 0023
"""

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"

KNOBS = (
    "event_log_max_payload_bytes",
    "content_cache_max",
    "content_cache_max_bytes",
    "content_cache_ttl_ms",
    "lockfile_cache_max",
    "lockfile_cache_max_bytes",
    "lockfile_cache_ttl_ms",
)


def upgrade() -> None:
    with op.batch_alter_table("cluster_settings") as batch:
        for knob in KNOBS:
            batch.add_column(sa.Column(knob, sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cluster_settings") as batch:
        for knob in KNOBS:
            batch.drop_column(knob)
