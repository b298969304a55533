"""The cache knobs in `cluster_settings` and `org_settings` (docs/design/caches.md §6).

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"

KNOBS = ("cache_max_entry_bytes", "cache_max_total_bytes", "cache_ttl_days")


def upgrade() -> None:
    for table in ("cluster_settings", "org_settings"):
        with op.batch_alter_table(table) as batch:
            for knob in KNOBS:
                batch.add_column(sa.Column(knob, sa.BigInteger(), nullable=True))


def downgrade() -> None:
    for table in ("org_settings", "cluster_settings"):
        with op.batch_alter_table(table) as batch:
            for knob in KNOBS:
                batch.drop_column(knob)
