"""The scaler's teardown-reattempt interval and event-claim retention as cluster knobs (docs/design/scaler.md §3,
§6.4): `cluster_settings.scaler_reap_reattempt_interval_ms` and `.scaler_claim_retention_ms`.

Revision ID: 0023
Revises: 0022
"""

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"

KNOBS = ("scaler_reap_reattempt_interval_ms", "scaler_claim_retention_ms")


def upgrade() -> None:
    with op.batch_alter_table("cluster_settings") as batch:
        for knob in KNOBS:
            batch.add_column(sa.Column(knob, sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cluster_settings") as batch:
        for knob in KNOBS:
            batch.drop_column(knob)
