"""Auto-scaler: spawn records, their history, firecracker IP allocations (issue 9).

Revision ID: 0006
Revises: 0005
"""

from typing import Any

import sqlalchemy as sa
from alembic import op

import conveyor.db.types as ct

revision = "0006"
down_revision = "0005"


def _spawn_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("boot_id", sa.String(length=36), nullable=False),
        sa.Column("scaler", sa.String(length=64), nullable=False),
        sa.Column("backend_type", sa.String(length=32), nullable=False),
        sa.Column("label_set", ct.JSONDocument, nullable=False),
        sa.Column("backend_ref", sa.String(length=255), nullable=True),
        sa.Column("bound_job_id", sa.String(length=36), nullable=True),
        sa.Column("run_id", sa.String(length=36), nullable=True),
        sa.Column("org_id", sa.String(length=64), nullable=True),
        sa.Column("warm", sa.Boolean(), server_default="0", nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "scaler_spawns",
        *_spawn_columns(),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("cpus", sa.Float(), server_default="0", nullable=False),
        sa.Column("mem_bytes", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("token_id", sa.String(length=36), nullable=True),
        sa.Column("spawned_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("deadline_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("registered_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("agent_id", name=op.f("pk_scaler_spawns")),
    )
    op.create_index("ix_scaler_spawns_node", "scaler_spawns", ["node_id"])
    op.create_index("ix_scaler_spawns_bound_job_id", "scaler_spawns", ["bound_job_id"])
    op.create_table(
        "scaler_spawn_history",
        *_spawn_columns(),
        sa.Column("cpus", sa.Float(), server_default="0", nullable=False),
        sa.Column("mem_bytes", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("token_id", sa.String(length=36), nullable=True),
        sa.Column("spawned_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("deadline_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("registered_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.Column("ended_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("log_tail", ct.JSONDocument, nullable=True),
        sa.PrimaryKeyConstraint("agent_id", name=op.f("pk_scaler_spawn_history")),
    )
    op.create_index("ix_scaler_spawn_history_ended_at", "scaler_spawn_history", ["ended_at"])
    op.create_table(
        "ip_allocations",
        sa.Column("ip", sa.String(length=64), nullable=False),
        sa.Column("vm_id", sa.String(length=64), nullable=False),
        sa.Column("node_id", sa.String(length=64), nullable=False),
        sa.Column("allocated_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("ip", name=op.f("pk_ip_allocations")),
        sa.UniqueConstraint("vm_id", name=op.f("uq_ip_allocations_vm_id")),
    )


def downgrade() -> None:
    op.drop_table("ip_allocations")
    op.drop_index("ix_scaler_spawn_history_ended_at", table_name="scaler_spawn_history")
    op.drop_table("scaler_spawn_history")
    op.drop_index("ix_scaler_spawns_bound_job_id", table_name="scaler_spawns")
    op.drop_index("ix_scaler_spawns_node", table_name="scaler_spawns")
    op.drop_table("scaler_spawns")
