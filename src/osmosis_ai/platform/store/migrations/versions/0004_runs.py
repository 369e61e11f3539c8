"""Eval and training runs submitted from the CLI, and their logs.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# Migrations never import the ORM: a later change to it must not rewrite history.
UTC_TIME = sa.DateTime(timezone=True)
EVAL_STATUSES = "'pending', 'running', 'finished', 'failed', 'stopped'"
TRAINING_STATUSES = (
    "'pending', 'queued', 'running', 'finished', 'failed', 'crashed', 'stopped', 'killed', "
    "'unknown'"
)

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("workspace_id", sa.String(length=36), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("creator_id", sa.String(length=36), nullable=True),
        sa.Column("rollout_name", sa.String(length=255), nullable=False),
        sa.Column("rollout_id", sa.String(length=36), nullable=True),
        sa.Column("entrypoint", sa.String(length=1000), nullable=False),
        sa.Column("branch", sa.String(length=255), nullable=True),
        sa.Column("commit_sha", sa.String(length=64), nullable=False),
        sa.Column("model_path", sa.String(length=1000), nullable=False),
        sa.Column("model_id", sa.String(length=36), nullable=True),
        sa.Column("dataset_name", sa.String(length=255), nullable=False),
        sa.Column("dataset_id", sa.String(length=36), nullable=True),
        sa.Column("experiment_config", sa.JSON(), nullable=False),
        sa.Column("evaluation_config", sa.JSON(), nullable=True),
        sa.Column("training_config", sa.JSON(), nullable=True),
        sa.Column("sampling_config", sa.JSON(), nullable=True),
        sa.Column("checkpoints_config", sa.JSON(), nullable=True),
        sa.Column("advanced_config", sa.JSON(), nullable=True),
        sa.Column("env_config", sa.JSON(), nullable=True),
        sa.Column("required_secrets", sa.JSON(), nullable=False),
        sa.Column("secret_scopes", sa.JSON(), nullable=False),
        sa.Column("provided_secrets", sa.Text(), nullable=True),
        sa.Column("current_step", sa.Integer(), nullable=True),
        sa.Column("total_steps", sa.Integer(), nullable=True),
        sa.Column("examples_processed_count", sa.Integer(), nullable=True),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column("results", sa.JSON(), nullable=True),
        sa.Column("notes", sa.Text(), nullable=True),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.Column("updated_at", UTC_TIME, nullable=False),
        sa.Column("started_at", UTC_TIME, nullable=True),
        sa.Column("completed_at", UTC_TIME, nullable=True),
        sa.CheckConstraint("kind IN ('eval', 'training')", name=op.f("ck_runs_kind")),
        sa.CheckConstraint(
            f"(kind = 'eval' AND status IN ({EVAL_STATUSES})) "
            f"OR (kind = 'training' AND status IN ({TRAINING_STATUSES}))",
            name=op.f("ck_runs_status"),
        ),
        sa.ForeignKeyConstraint(
            ["creator_id"],
            ["users.id"],
            name=op.f("fk_runs_creator_id_users"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["datasets.id"],
            name=op.f("fk_runs_dataset_id_datasets"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name=op.f("fk_runs_model_id_models"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["rollout_id"],
            ["rollouts.id"],
            name=op.f("fk_runs_rollout_id_rollouts"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_runs_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint("workspace_id", "name", name=op.f("uq_runs_workspace_id_name")),
    )
    op.create_index(op.f("ix_runs_creator_id"), "runs", ["creator_id"], unique=False)
    op.create_index(op.f("ix_runs_status"), "runs", ["status"], unique=False)
    op.create_index(
        op.f("ix_runs_workspace_id_kind_created_at"),
        "runs",
        ["workspace_id", "kind", "created_at"],
        unique=False,
    )
    op.create_table(
        "run_logs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("timestamp", UTC_TIME, nullable=False),
        sa.Column("level", sa.String(length=16), nullable=False),
        sa.Column("step", sa.String(length=32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_run_logs_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_logs")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_run_logs_run_id_id"), "run_logs", ["run_id", "id"], unique=False)


def downgrade() -> None:
    op.drop_table("run_logs")
    op.drop_table("runs")
