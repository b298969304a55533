"""Artifacts and the blob store: `blobs`, `artifact_uploads`, `artifacts`, `test_reports`,
`dispatch_queue.job_token_hash`, and the artifact knobs in `cluster_settings` and `org_settings`
(docs/design/artifacts.md §3, §6).

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

from conveyor.db import types as ct

revision = "0014"
down_revision = "0013"

KNOBS = ("artifact_max_bytes", "artifact_run_max_bytes", "artifact_retention_days")


def upgrade() -> None:
    op.create_table(
        "blobs",
        sa.Column("sha256", sa.String(length=64), primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(length=8), nullable=False),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("touched_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.CheckConstraint("state IN ('live', 'doomed')", name="state"),
    )
    op.create_index("ix_blobs_touched_at", "blobs", ["touched_at"])
    op.create_table(
        "artifact_uploads",
        sa.Column("id", sa.String(length=36), primary_key=True),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_artifact_uploads_created_at", "artifact_uploads", ["created_at"])
    op.create_index("ix_artifact_uploads_sha256", "artifact_uploads", ["sha256"])
    op.create_table(
        "artifacts",
        sa.Column("id", sa.String(length=36), primary_key=True),
        sa.Column("org_id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("routing_key", sa.String(length=255), nullable=True),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("format", sa.String(length=8), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("blob_sha256", sa.String(length=64), nullable=False),
        sa.Column("file_count", sa.Integer(), nullable=False),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", ct.UTCDateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("run_id", "name", name="uq_artifacts_run_name"),
        sa.CheckConstraint("format IN ('file', 'tar')", name="format"),
    )
    op.create_index("ix_artifacts_blob_sha256", "artifacts", ["blob_sha256"])
    op.create_index("ix_artifacts_expires_at", "artifacts", ["expires_at"])
    op.create_table(
        "test_reports",
        sa.Column("id", sa.String(length=36), primary_key=True),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("artifact_id", sa.String(length=36), nullable=True),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("passed", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("skipped", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("failures", ct.JSONDocument, nullable=False),
        sa.Column("created_at", ct.UTCDateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_test_reports_run_id", "test_reports", ["run_id"])
    with op.batch_alter_table("dispatch_queue") as batch:
        batch.add_column(sa.Column("job_token_hash", sa.String(length=64), nullable=True))
        batch.create_unique_constraint("uq_dispatch_queue_job_token_hash", ["job_token_hash"])
    for table in ("cluster_settings", "org_settings"):
        with op.batch_alter_table(table) as batch:
            for knob in KNOBS:
                batch.add_column(sa.Column(knob, sa.BigInteger(), nullable=True))


def downgrade() -> None:
    for table in ("org_settings", "cluster_settings"):
        with op.batch_alter_table(table) as batch:
            for knob in KNOBS:
                batch.drop_column(knob)
    with op.batch_alter_table("dispatch_queue") as batch:
        batch.drop_constraint("uq_dispatch_queue_job_token_hash", type_="unique")
        batch.drop_column("job_token_hash")
    op.drop_table("test_reports")
    op.drop_table("artifacts")
    op.drop_table("artifact_uploads")
    op.drop_table("blobs")
