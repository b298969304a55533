"""Global workflows (docs/design/global_workflows.md §1, §5, §6): the org's policy sources
(`org_settings.global_sources`), the run's policy source (`runs.global_source`, `runs.global_required`) and the four
`global_eval_*` cluster knobs.

Revision ID: 0031
Revises: 0030
"""

import sqlalchemy as sa
from alembic import op

import conveyor.db.types as ct

revision = "0031"
down_revision = "0030"

KNOBS = (
    "global_eval_round_timeout_ms",
    "global_eval_candidate_timeout_ms",
    "global_eval_cache_max",
    "global_eval_wait_timeout_ms",
)


def upgrade() -> None:
    with op.batch_alter_table("cluster_settings") as batch:
        for knob in KNOBS:
            batch.add_column(sa.Column(knob, sa.BigInteger(), nullable=True))
    with op.batch_alter_table("org_settings") as batch:
        batch.add_column(sa.Column("global_sources", ct.JSONDocument, nullable=True))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("global_source", sa.String(255), nullable=True))
        batch.add_column(sa.Column("global_required", sa.Boolean(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("global_required")
        batch.drop_column("global_source")
    with op.batch_alter_table("org_settings") as batch:
        batch.drop_column("global_sources")
    with op.batch_alter_table("cluster_settings") as batch:
        for knob in reversed(KNOBS):
            batch.drop_column(knob)
