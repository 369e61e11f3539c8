"""The initial schema: accounts, tokens, device logins, datasets, secrets, models, Git sync.

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# Migrations never import the ORM: a later change to it must not rewrite history.
UTC_TIME = sa.DateTime(timezone=True)

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("email", name=op.f("uq_users_email")),
    )
    op.create_table(
        "workspaces",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("repo_full_name", sa.String(length=200), nullable=False),
        sa.Column("clone_url", sa.Text(), nullable=False),
        sa.Column("default_branch", sa.String(length=255), nullable=True),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workspaces")),
        sa.UniqueConstraint("name", name=op.f("uq_workspaces_name")),
        sa.UniqueConstraint("repo_full_name", name=op.f("uq_workspaces_repo_full_name")),
    )
    op.create_table(
        "datasets",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("workspace_id", sa.String(length=36), nullable=False),
        sa.Column("file_name", sa.String(length=255), nullable=False),
        sa.Column("extension", sa.String(length=16), nullable=False),
        sa.Column("file_size", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("row_count", sa.Integer(), nullable=True),
        sa.Column("data_preview", sa.JSON(), nullable=True),
        sa.Column("file_format", sa.String(length=16), nullable=True),
        sa.Column("original_file_format", sa.String(length=16), nullable=True),
        sa.Column("original_file_size", sa.BigInteger(), nullable=True),
        sa.Column("object_key", sa.Text(), nullable=True),
        sa.Column("creator_id", sa.String(length=36), nullable=True),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.Column("updated_at", UTC_TIME, nullable=False),
        sa.CheckConstraint(
            "status IN ('uploading', 'pending', 'processing', 'uploaded', 'error', 'cancelled')",
            name=op.f("ck_datasets_status"),
        ),
        sa.ForeignKeyConstraint(
            ["creator_id"],
            ["users.id"],
            name=op.f("fk_datasets_creator_id_users"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_datasets_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_datasets")),
    )
    op.create_index(op.f("ix_datasets_creator_id"), "datasets", ["creator_id"], unique=False)
    op.create_index(op.f("ix_datasets_workspace_id"), "datasets", ["workspace_id"], unique=False)
    op.create_index(
        op.f("ix_datasets_workspace_id_file_name"),
        "datasets",
        ["workspace_id", "file_name"],
        unique=False,
    )

    op.create_table(
        "git_sync_events",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("workspace_id", sa.String(length=36), nullable=False),
        sa.Column("branch", sa.String(length=255), nullable=True),
        sa.Column("commit_sha", sa.String(length=64), nullable=True),
        sa.Column("author", sa.String(length=255), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.Column("started_at", UTC_TIME, nullable=True),
        sa.Column("finished_at", UTC_TIME, nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'syncing', 'success', 'failed')",
            name=op.f("ck_git_sync_events_status"),
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_git_sync_events_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_git_sync_events")),
    )
    op.create_index(
        op.f("ix_git_sync_events_workspace_id_created_at"),
        "git_sync_events",
        ["workspace_id", "created_at"],
        unique=False,
    )

    op.create_table(
        "memberships",
        sa.Column("workspace_id", sa.String(length=36), nullable=False),
        sa.Column("user_id", sa.String(length=36), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.CheckConstraint(
            "role IN ('owner', 'admin', 'member')", name=op.f("ck_memberships_role")
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_memberships_user_id_users"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_memberships_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workspace_id", "user_id", name=op.f("pk_memberships")),
    )
    op.create_index(op.f("ix_memberships_user_id"), "memberships", ["user_id"], unique=False)

    op.create_table(
        "models",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("workspace_id", sa.String(length=36), nullable=True),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("base_model", sa.String(length=255), nullable=True),
        sa.Column("creator_id", sa.String(length=36), nullable=True),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.Column("updated_at", UTC_TIME, nullable=False),
        sa.CheckConstraint("kind IN ('base', 'lora')", name=op.f("ck_models_kind")),
        sa.ForeignKeyConstraint(
            ["creator_id"],
            ["users.id"],
            name=op.f("fk_models_creator_id_users"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_models_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint("name", name=op.f("uq_models_name")),
    )
    op.create_index(op.f("ix_models_creator_id"), "models", ["creator_id"], unique=False)
    op.create_index(op.f("ix_models_workspace_id"), "models", ["workspace_id"], unique=False)

    op.create_table(
        "rollouts",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("workspace_id", sa.String(length=36), nullable=False),
        sa.Column("branch", sa.String(length=255), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("is_active", sa.Boolean(), nullable=False),
        sa.Column("last_synced_commit_sha", sa.String(length=64), nullable=True),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.Column("updated_at", UTC_TIME, nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_rollouts_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollouts")),
        sa.UniqueConstraint(
            "workspace_id", "branch", "name", name=op.f("uq_rollouts_workspace_id_branch_name")
        ),
    )
    op.create_index(op.f("ix_rollouts_workspace_id"), "rollouts", ["workspace_id"], unique=False)

    op.create_table(
        "secrets",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("workspace_id", sa.String(length=36), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("owner_user_id", sa.String(length=36), nullable=True),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("encrypted_value", sa.Text(), nullable=False),
        sa.Column("creator_id", sa.String(length=36), nullable=True),
        sa.Column("updater_id", sa.String(length=36), nullable=True),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.Column("updated_at", UTC_TIME, nullable=False),
        sa.CheckConstraint(
            "(scope = 'user' AND owner_user_id IS NOT NULL) "
            "OR (scope = 'workspace' AND owner_user_id IS NULL)",
            name=op.f("ck_secrets_owner"),
        ),
        sa.CheckConstraint("scope IN ('workspace', 'user')", name=op.f("ck_secrets_scope")),
        sa.ForeignKeyConstraint(
            ["creator_id"],
            ["users.id"],
            name=op.f("fk_secrets_creator_id_users"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["owner_user_id"],
            ["users.id"],
            name=op.f("fk_secrets_owner_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["updater_id"],
            ["users.id"],
            name=op.f("fk_secrets_updater_id_users"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_secrets_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_secrets")),
    )
    op.create_index(op.f("ix_secrets_creator_id"), "secrets", ["creator_id"], unique=False)
    op.create_index(op.f("ix_secrets_owner_user_id"), "secrets", ["owner_user_id"], unique=False)
    op.create_index(op.f("ix_secrets_updater_id"), "secrets", ["updater_id"], unique=False)
    op.create_index(op.f("ix_secrets_workspace_id"), "secrets", ["workspace_id"], unique=False)
    op.create_index(
        "uq_secrets_user_name",
        "secrets",
        ["workspace_id", "owner_user_id", "name"],
        unique=True,
        sqlite_where=sa.text("scope = 'user'"),
        postgresql_where=sa.text("scope = 'user'"),
    )
    op.create_index(
        "uq_secrets_workspace_name",
        "secrets",
        ["workspace_id", "name"],
        unique=True,
        sqlite_where=sa.text("scope = 'workspace'"),
        postgresql_where=sa.text("scope = 'workspace'"),
    )

    op.create_table(
        "tokens",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("user_id", sa.String(length=36), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("platform_url", sa.Text(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.Column("expires_at", UTC_TIME, nullable=False),
        sa.Column("revoked_at", UTC_TIME, nullable=True),
        sa.Column("last_used_at", UTC_TIME, nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_tokens_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_tokens_token_hash")),
    )
    op.create_index(op.f("ix_tokens_user_id"), "tokens", ["user_id"], unique=False)

    op.create_table(
        "dataset_logs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("dataset_id", sa.String(length=36), nullable=False),
        sa.Column("timestamp", UTC_TIME, nullable=False),
        sa.Column("level", sa.String(length=16), nullable=False),
        sa.Column("step", sa.String(length=32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["datasets.id"],
            name=op.f("fk_dataset_logs_dataset_id_datasets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dataset_logs")),
        sqlite_autoincrement=True,
    )
    op.create_index(
        op.f("ix_dataset_logs_dataset_id_id"), "dataset_logs", ["dataset_id", "id"], unique=False
    )

    op.create_table(
        "device_authorizations",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("device_code_hash", sa.String(length=64), nullable=False),
        sa.Column("user_code", sa.String(length=16), nullable=False),
        sa.Column("device_name", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.Column("expires_at", UTC_TIME, nullable=False),
        sa.Column("interval_s", sa.Integer(), nullable=False),
        sa.Column("last_polled_at", UTC_TIME, nullable=True),
        sa.Column("user_id", sa.String(length=36), nullable=True),
        sa.Column("token_id", sa.String(length=36), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'approved', 'denied', 'consumed')",
            name=op.f("ck_device_authorizations_status"),
        ),
        sa.ForeignKeyConstraint(
            ["token_id"],
            ["tokens.id"],
            name=op.f("fk_device_authorizations_token_id_tokens"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_device_authorizations_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_device_authorizations")),
        sa.UniqueConstraint(
            "device_code_hash", name=op.f("uq_device_authorizations_device_code_hash")
        ),
    )
    op.create_index(
        op.f("ix_device_authorizations_user_code"),
        "device_authorizations",
        ["user_code"],
        unique=False,
    )
    op.create_index(
        op.f("ix_device_authorizations_user_id"), "device_authorizations", ["user_id"], unique=False
    )

    op.create_table(
        "uploads",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("dataset_id", sa.String(length=36), nullable=False),
        sa.Column("method", sa.String(length=16), nullable=False),
        sa.Column("expected_size", sa.BigInteger(), nullable=False),
        sa.Column("part_size", sa.BigInteger(), nullable=True),
        sa.Column("total_parts", sa.Integer(), nullable=True),
        sa.Column("parts", sa.JSON(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_at", UTC_TIME, nullable=False),
        sa.Column("updated_at", UTC_TIME, nullable=False),
        sa.Column("expires_at", UTC_TIME, nullable=True),
        sa.CheckConstraint("method IN ('simple', 'multipart')", name=op.f("ck_uploads_method")),
        sa.CheckConstraint(
            "state IN ('pending', 'completed', 'aborted')", name=op.f("ck_uploads_state")
        ),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["datasets.id"],
            name=op.f("fk_uploads_dataset_id_datasets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_uploads")),
    )
    op.create_index(op.f("ix_uploads_dataset_id"), "uploads", ["dataset_id"], unique=False)


def downgrade() -> None:
    op.drop_table("uploads")
    op.drop_table("device_authorizations")
    op.drop_table("dataset_logs")
    op.drop_table("tokens")
    op.drop_table("secrets")
    op.drop_table("rollouts")
    op.drop_table("models")
    op.drop_table("memberships")
    op.drop_table("git_sync_events")
    op.drop_table("datasets")
    op.drop_table("workspaces")
    op.drop_table("users")
