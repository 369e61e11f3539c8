"""Managed runs: workers and their leases on runs, eval samples, metric points, checkpoints,
local eval imports, and the LoRA models trained checkpoints become (with their deployment).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# Migrations never import the ORM: a later change to it must not rewrite history.
UTC_TIME = sa.DateTime(timezone=True)

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("wake_address", sa.String(length=255), nullable=True),
        sa.Column("started_at", UTC_TIME, nullable=False),
        sa.Column("heartbeat_at", UTC_TIME, nullable=False),
        sa.Column("stopped_at", UTC_TIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workers")),
    )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("worker_id", sa.String(length=36), nullable=True))
        batch.add_column(sa.Column("lease_expires_at", UTC_TIME, nullable=True))
        batch.add_column(
            sa.Column("attempt", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )
        batch.add_column(sa.Column("error", sa.Text(), nullable=True))
        batch.create_foreign_key(
            op.f("fk_runs_worker_id_workers"), "workers", ["worker_id"], ["id"], ondelete="SET NULL"
        )
        batch.create_index(
            op.f("ix_runs_status_created_at"), ["status", "created_at"], unique=False
        )
    with op.batch_alter_table("runs") as batch:
        batch.alter_column("attempt", server_default=None)
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("training_run_id", sa.String(length=36), nullable=True))
        batch.add_column(sa.Column("checkpoint_step", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("reward", sa.Float(), nullable=True))
        batch.add_column(sa.Column("deployment_status", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("deployed_at", UTC_TIME, nullable=True))
        batch.add_column(sa.Column("deployed_by", sa.String(length=36), nullable=True))
        batch.create_foreign_key(
            op.f("fk_models_training_run_id_runs"),
            "runs",
            ["training_run_id"],
            ["id"],
            ondelete="SET NULL",
        )
        batch.create_foreign_key(
            op.f("fk_models_deployed_by_users"),
            "users",
            ["deployed_by"],
            ["id"],
            ondelete="SET NULL",
        )
        batch.create_index(op.f("ix_models_training_run_id"), ["training_run_id"], unique=False)
        batch.create_index(op.f("ix_models_deployed_by"), ["deployed_by"], unique=False)
    op.create_table(
        "run_samples",
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("row_index", sa.Integer(), nullable=False),
        sa.Column("run_index", sa.Integer(), nullable=False),
        sa.Column("source_row_index", sa.Integer(), nullable=True),
        sa.Column("rollout_id", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column("tokens", sa.Integer(), nullable=True),
        sa.Column("duration_ms", sa.Integer(), nullable=True),
        sa.Column("error_type", sa.String(length=64), nullable=True),
        sa.Column("trajectory_key", sa.Text(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_run_samples_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "row_index", "run_index", name=op.f("pk_run_samples")),
    )
    op.create_table(
        "run_metrics",
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("timestamp", UTC_TIME, nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_run_metrics_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "key", "step", name=op.f("pk_run_metrics")),
    )
    op.create_table(
        "run_checkpoints",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column("object_prefix", sa.Text(), nullable=False),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_run_checkpoints_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_checkpoints")),
        sa.UniqueConstraint("run_id", "step", name=op.f("uq_run_checkpoints_run_id_step")),
    )
    op.create_table(
        "eval_imports",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("workspace_id", sa.String(length=36), nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("creator_id", sa.String(length=36), nullable=True),
        sa.Column("local_run_id", sa.String(length=64), nullable=False),
        sa.Column("manifest_digest", sa.String(length=128), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("expires_at", UTC_TIME, nullable=False),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.ForeignKeyConstraint(
            ["creator_id"],
            ["users.id"],
            name=op.f("fk_eval_imports_creator_id_users"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_eval_imports_run_id_runs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_eval_imports_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_imports")),
        sa.UniqueConstraint(
            "workspace_id",
            "local_run_id",
            "manifest_digest",
            name=op.f("uq_eval_imports_workspace_id_local_run_id_manifest_digest"),
        ),
    )
    op.create_index(
        op.f("ix_eval_imports_creator_id"), "eval_imports", ["creator_id"], unique=False
    )
    op.create_index(
        op.f("ix_eval_imports_workspace_id"), "eval_imports", ["workspace_id"], unique=False
    )


def downgrade() -> None:
    op.drop_table("eval_imports")
    op.drop_table("run_checkpoints")
    op.drop_table("run_metrics")
    op.drop_table("run_samples")
    with op.batch_alter_table("models") as batch:
        batch.drop_index(op.f("ix_models_deployed_by"))
        batch.drop_index(op.f("ix_models_training_run_id"))
        batch.drop_constraint(op.f("fk_models_deployed_by_users"), type_="foreignkey")
        batch.drop_constraint(op.f("fk_models_training_run_id_runs"), type_="foreignkey")
        for column in (
            "deployed_by",
            "deployed_at",
            "deployment_status",
            "reward",
            "checkpoint_step",
            "training_run_id",
        ):
            batch.drop_column(column)
    with op.batch_alter_table("runs") as batch:
        batch.drop_index(op.f("ix_runs_status_created_at"))
        batch.drop_constraint(op.f("fk_runs_worker_id_workers"), type_="foreignkey")
        for column in ("error", "attempt", "lease_expires_at", "worker_id"):
            batch.drop_column(column)
    op.drop_table("workers")
