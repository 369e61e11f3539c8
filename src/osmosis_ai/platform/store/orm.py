"""Every table of the platform, as SQLAlchemy 2 typed declarative models (the one ORM module).

The schema changes only through the migrations in ``store/migrations/versions``; a test checks
that migrating an empty database gives exactly these tables. Ids are random UUID strings;
times are timezone-aware UTC (stored naive on SQLite). Raw tokens and secret values never
reach a table: tokens are stored as SHA-256 hashes, secrets encrypted.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ROLES = ("owner", "admin", "member")
DEVICE_STATUSES = ("pending", "approved", "denied", "consumed")
DATASET_STATUSES = ("uploading", "pending", "processing", "uploaded", "error", "cancelled")
UPLOAD_METHODS = ("simple", "multipart")
UPLOAD_STATES = ("pending", "completed", "aborted")
SECRET_SCOPES = ("workspace", "user")
MODEL_KINDS = ("base", "lora")
SYNC_STATUSES = ("pending", "syncing", "success", "failed")
RUN_KINDS = ("eval", "training")
EVAL_RUN_STATUSES = ("pending", "running", "finished", "failed", "stopped")
TRAINING_RUN_STATUSES = (
    "pending",
    "queued",
    "running",
    "finished",
    "failed",
    "crashed",
    "stopped",
    "killed",
    "unknown",
)


def new_id() -> str:
    return str(uuid.uuid4())


def utcnow() -> datetime:
    return datetime.now(UTC)


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class UTCDateTime(TypeDecorator[datetime]):
    """An aware UTC datetime on every dialect (SQLite keeps no zone, so it is stored naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: store timezone-aware UTC times")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _id() -> Mapped[str]:
    return mapped_column(String(36), primary_key=True, default=new_id)


def _created() -> Mapped[datetime]:
    return mapped_column(UTCDateTime(), default=utcnow)


def _updated() -> Mapped[datetime]:
    return mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)


def _user_ref(*, nullable: bool = True, ondelete: str = "SET NULL") -> Mapped[str | None]:
    return mapped_column(
        String(36), ForeignKey("users.id", ondelete=ondelete), nullable=nullable, index=True
    )


def _workspace_ref() -> Mapped[str]:
    return mapped_column(String(36), ForeignKey("workspaces.id", ondelete="CASCADE"), index=True)


# --- accounts --------------------------------------------------------------------------------


class User(Base):
    __tablename__ = "users"

    id: Mapped[str] = _id()
    email: Mapped[str] = mapped_column(String(320), unique=True)  # lower-cased
    name: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = _created()


class Workspace(Base):
    """A team space, connected to one Git repository (``owner/repo``, lower-cased)."""

    __tablename__ = "workspaces"

    id: Mapped[str] = _id()
    name: Mapped[str] = mapped_column(String(100), unique=True)
    repo_full_name: Mapped[str] = mapped_column(String(200), unique=True)
    clone_url: Mapped[str] = mapped_column(Text)
    default_branch: Mapped[str | None] = mapped_column(String(255))  # learnt by Git sync
    git_fetched_at: Mapped[datetime | None] = mapped_column(UTCDateTime())  # last good fetch
    created_at: Mapped[datetime] = _created()


class Membership(Base):
    __tablename__ = "memberships"
    __table_args__ = (CheckConstraint(_one_of("role", ROLES), name="role"),)

    workspace_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True
    )
    user_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = _created()


class Token(Base):
    """An API token: only the SHA-256 of the random token is kept, with the URL it is for."""

    __tablename__ = "tokens"

    id: Mapped[str] = _id()
    user_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("users.id", ondelete="CASCADE"), index=True
    )
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    platform_url: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = _created()
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Raised by a dashboard sign-out: session cookies minted under an older value are refused.
    session_generation: Mapped[int] = mapped_column(Integer, default=0)


class DeviceAuthorization(Base):
    """One device-code login (RFC 8628): the token is minted on the first poll after approval."""

    __tablename__ = "device_authorizations"
    __table_args__ = (CheckConstraint(_one_of("status", DEVICE_STATUSES), name="status"),)

    id: Mapped[str] = _id()
    device_code_hash: Mapped[str] = mapped_column(String(64), unique=True)
    user_code: Mapped[str] = mapped_column(String(16), index=True)
    device_name: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), default="pending")
    created_at: Mapped[datetime] = _created()
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    interval_s: Mapped[int] = mapped_column(Integer)
    last_polled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    user_id: Mapped[str | None] = _user_ref(ondelete="CASCADE")  # who approved or denied
    token_id: Mapped[str | None] = mapped_column(
        String(36), ForeignKey("tokens.id", ondelete="SET NULL")
    )


# --- datasets --------------------------------------------------------------------------------


class Dataset(Base):
    __tablename__ = "datasets"
    __table_args__ = (
        CheckConstraint(_one_of("status", DATASET_STATUSES), name="status"),
        Index(None, "workspace_id", "file_name"),
        Index(None, "workspace_id", "created_at", "id"),  # the list order (newest first)
    )

    id: Mapped[str] = _id()
    workspace_id: Mapped[str] = _workspace_ref()
    file_name: Mapped[str] = mapped_column(String(255))
    extension: Mapped[str] = mapped_column(String(16))
    file_size: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16), default="uploading")
    row_count: Mapped[int | None] = mapped_column(Integer)
    data_preview: Mapped[list[dict[str, object]] | None] = mapped_column(JSON)
    file_format: Mapped[str | None] = mapped_column(String(16))
    original_file_format: Mapped[str | None] = mapped_column(String(16))
    original_file_size: Mapped[int | None] = mapped_column(BigInteger)
    object_key: Mapped[str | None] = mapped_column(Text)
    creator_id: Mapped[str | None] = _user_ref()
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _updated()


class DatasetLog(Base):
    """A processing log line; the autoincrement id is the pagination cursor (never reused)."""

    __tablename__ = "dataset_logs"
    __table_args__ = (Index(None, "dataset_id", "id"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dataset_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("datasets.id", ondelete="CASCADE")
    )
    timestamp: Mapped[datetime] = _created()
    level: Mapped[str] = mapped_column(String(16), default="info")
    step: Mapped[str] = mapped_column(String(32), default="")  # upload, processing, validation
    message: Mapped[str] = mapped_column(Text)
    details: Mapped[dict[str, object] | None] = mapped_column(JSON)


class Upload(Base):
    """A dataset file upload in flight: simple PUT or multipart with its parts' ETags."""

    __tablename__ = "uploads"
    __table_args__ = (
        CheckConstraint(_one_of("method", UPLOAD_METHODS), name="method"),
        CheckConstraint(_one_of("state", UPLOAD_STATES), name="state"),
    )

    id: Mapped[str] = _id()
    dataset_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("datasets.id", ondelete="CASCADE"), index=True
    )
    method: Mapped[str] = mapped_column(String(16))
    expected_size: Mapped[int] = mapped_column(BigInteger)
    part_size: Mapped[int | None] = mapped_column(BigInteger)
    total_parts: Mapped[int | None] = mapped_column(Integer)
    parts: Mapped[list[dict[str, object]] | None] = mapped_column(JSON)  # [{part_number, etag}]
    state: Mapped[str] = mapped_column(String(16), default="pending")
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _updated()
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


# --- secrets and models ----------------------------------------------------------------------


class Secret(Base):
    """A write-only secret: workspace-wide, or personal (scope ``user``) to its owner."""

    __tablename__ = "secrets"
    __table_args__ = (
        CheckConstraint(_one_of("scope", SECRET_SCOPES), name="scope"),
        CheckConstraint(
            "(scope = 'user' AND owner_user_id IS NOT NULL) "
            "OR (scope = 'workspace' AND owner_user_id IS NULL)",
            name="owner",
        ),
        Index(
            "uq_secrets_workspace_name",
            "workspace_id",
            "name",
            unique=True,
            sqlite_where=text("scope = 'workspace'"),
            postgresql_where=text("scope = 'workspace'"),
        ),
        Index(
            "uq_secrets_user_name",
            "workspace_id",
            "owner_user_id",
            "name",
            unique=True,
            sqlite_where=text("scope = 'user'"),
            postgresql_where=text("scope = 'user'"),
        ),
    )

    id: Mapped[str] = _id()
    workspace_id: Mapped[str] = _workspace_ref()
    scope: Mapped[str] = mapped_column(String(16))
    owner_user_id: Mapped[str | None] = _user_ref(ondelete="CASCADE")
    name: Mapped[str] = mapped_column(String(255))
    encrypted_value: Mapped[str] = mapped_column(Text)  # crypto.SecretBox form
    creator_id: Mapped[str | None] = _user_ref()
    updater_id: Mapped[str | None] = _user_ref()
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _updated()


class Model(Base):
    """A model the platform can serve or train: a base model from a local HF dir, or a LoRA."""

    __tablename__ = "models"
    __table_args__ = (CheckConstraint(_one_of("kind", MODEL_KINDS), name="kind"),)

    id: Mapped[str] = _id()
    workspace_id: Mapped[str | None] = mapped_column(
        String(36), ForeignKey("workspaces.id", ondelete="CASCADE"), index=True
    )  # None: a base model every workspace sees
    kind: Mapped[str] = mapped_column(String(8), default="base")
    name: Mapped[str] = mapped_column(String(255), unique=True)
    path: Mapped[str] = mapped_column(Text)
    base_model: Mapped[str | None] = mapped_column(String(255))
    creator_id: Mapped[str | None] = _user_ref()
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _updated()
    # LoRA models: the training run and checkpoint they come from, and their deployment
    training_run_id: Mapped[str | None] = mapped_column(
        String(36), ForeignKey("runs.id", ondelete="SET NULL", use_alter=True), index=True
    )  # use_alter: runs refer to models too
    checkpoint_step: Mapped[int | None] = mapped_column(Integer)
    reward: Mapped[float | None] = mapped_column(Float)
    deployment_status: Mapped[str | None] = mapped_column(String(16))  # active | inactive
    deployed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    deployed_by: Mapped[str | None] = _user_ref()


# --- Git sync --------------------------------------------------------------------------------


class Rollout(Base):
    """A ``rollouts/<name>/`` folder (with ``main.py``) found on one branch by Git sync."""

    __tablename__ = "rollouts"
    __table_args__ = (UniqueConstraint("workspace_id", "branch", "name"),)

    id: Mapped[str] = _id()
    workspace_id: Mapped[str] = _workspace_ref()
    branch: Mapped[str] = mapped_column(String(255))
    name: Mapped[str] = mapped_column(String(255))
    description: Mapped[str | None] = mapped_column(Text)
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    last_synced_commit_sha: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _updated()


class GitBranch(Base):
    """A branch of a workspace repository as of the last sync, and the commit it was read at."""

    __tablename__ = "git_branches"

    workspace_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    commit_sha: Mapped[str] = mapped_column(String(64))
    synced_at: Mapped[datetime] = mapped_column(UTCDateTime())


class GitSyncEvent(Base):
    """One sync of a workspace repository (or one of its branches) and how it ended."""

    __tablename__ = "git_sync_events"
    __table_args__ = (
        CheckConstraint(_one_of("status", SYNC_STATUSES), name="status"),
        Index(None, "workspace_id", "created_at"),
    )

    id: Mapped[str] = _id()
    workspace_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("workspaces.id", ondelete="CASCADE")
    )
    branch: Mapped[str | None] = mapped_column(String(255))
    commit_sha: Mapped[str | None] = mapped_column(String(64))
    author: Mapped[str | None] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16), default="pending")
    message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


# --- runs ------------------------------------------------------------------------------------


class Run(Base):
    """An eval or training run submitted from the CLI.

    It holds what to run (the rollout and entrypoint at a commit resolved when it was
    submitted, the config sections as sent), on what (dataset and model, by name and row),
    and how it is going. Values given for this run's secrets are sealed in
    ``provided_secrets`` (``crypto.SecretBox``, bound to the run) and dropped once it ends.
    """

    __tablename__ = "runs"
    __table_args__ = (
        CheckConstraint(_one_of("kind", RUN_KINDS), name="kind"),
        CheckConstraint(
            f"(kind = 'eval' AND {_one_of('status', EVAL_RUN_STATUSES)}) "
            f"OR (kind = 'training' AND {_one_of('status', TRAINING_RUN_STATUSES)})",
            name="status",
        ),
        UniqueConstraint("workspace_id", "name"),
        Index(None, "workspace_id", "kind", "created_at"),
        Index(None, "status"),
        Index(None, "status", "created_at"),
    )

    id: Mapped[str] = _id()
    workspace_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("workspaces.id", ondelete="CASCADE")
    )
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(16), default="pending")
    creator_id: Mapped[str | None] = _user_ref()
    # the code: a rollout folder of the workspace repository at one commit
    rollout_name: Mapped[str] = mapped_column(String(255))
    rollout_id: Mapped[str | None] = mapped_column(
        String(36), ForeignKey("rollouts.id", ondelete="SET NULL")
    )
    entrypoint: Mapped[str] = mapped_column(String(1000))
    branch: Mapped[str | None] = mapped_column(String(255))  # None: a pinned commit
    commit_sha: Mapped[str] = mapped_column(String(64))
    # what it runs on
    model_path: Mapped[str] = mapped_column(String(1000))
    model_id: Mapped[str | None] = mapped_column(
        String(36), ForeignKey("models.id", ondelete="SET NULL")
    )  # training runs: the base model
    dataset_name: Mapped[str] = mapped_column(String(255))
    dataset_id: Mapped[str | None] = mapped_column(
        String(36), ForeignKey("datasets.id", ondelete="SET NULL")
    )
    # the config sections as submitted
    experiment_config: Mapped[dict[str, object]] = mapped_column(JSON)
    evaluation_config: Mapped[dict[str, object] | None] = mapped_column(JSON)
    training_config: Mapped[dict[str, object] | None] = mapped_column(JSON)
    sampling_config: Mapped[dict[str, object] | None] = mapped_column(JSON)
    checkpoints_config: Mapped[dict[str, object] | None] = mapped_column(JSON)
    advanced_config: Mapped[dict[str, object] | None] = mapped_column(JSON)
    env_config: Mapped[dict[str, str] | None] = mapped_column(JSON)
    # secrets: names, where each resolved from at submit, and this run's own sealed values
    required_secrets: Mapped[list[str]] = mapped_column(JSON)
    secret_scopes: Mapped[dict[str, str]] = mapped_column(JSON)
    provided_secrets: Mapped[str | None] = mapped_column(Text)
    # progress and outcome
    current_step: Mapped[int | None] = mapped_column(Integer)
    total_steps: Mapped[int | None] = mapped_column(Integer)
    examples_processed_count: Mapped[int | None] = mapped_column(Integer)
    reward: Mapped[float | None] = mapped_column(Float)
    results: Mapped[dict[str, object] | None] = mapped_column(JSON)
    notes: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _updated()
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # execution: the worker holding the run's lease, which attempt it is (the fence every
    # write of a worker carries), and why it failed
    worker_id: Mapped[str | None] = mapped_column(
        String(36), ForeignKey("workers.id", ondelete="SET NULL")
    )
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    # the attempt before the current execution began (0; a retry sets it to ``attempt``):
    # only the claims since then count toward giving up on a run whose workers keep dying
    attempts_base: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)


class Worker(Base):
    """A process that claims queued runs and executes them (``osmosis platform worker``)."""

    __tablename__ = "workers"

    id: Mapped[str] = _id()
    name: Mapped[str] = mapped_column(String(255))  # host:pid
    slots: Mapped[int] = mapped_column(Integer, default=1)
    wake_address: Mapped[str | None] = mapped_column(String(255))  # udp host:port
    started_at: Mapped[datetime] = _created()
    heartbeat_at: Mapped[datetime] = _created()
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class RunSample(Base):
    """One evaluated work item (dataset row × run index) of an eval run: exactly one per key."""

    __tablename__ = "run_samples"

    run_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    row_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    source_row_index: Mapped[int | None] = mapped_column(Integer)
    rollout_id: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))  # success | failed | skipped
    reward: Mapped[float | None] = mapped_column(Float)
    tokens: Mapped[int | None] = mapped_column(Integer)
    duration_ms: Mapped[int | None] = mapped_column(Integer)
    error_type: Mapped[str | None] = mapped_column(String(64))
    trajectory_key: Mapped[str | None] = mapped_column(Text)  # object key of the ATIF file
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[datetime] = _created()


class RunMetric(Base):
    """A metric point of a run (training: per step; eval: the final aggregates at step 0)."""

    __tablename__ = "run_metrics"

    run_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    value: Mapped[float | None] = mapped_column(Float)  # None: not finite
    timestamp: Mapped[datetime] = _created()


class RunCheckpoint(Base):
    """A saved training checkpoint; its files live in the object store under ``object_prefix``."""

    __tablename__ = "run_checkpoints"
    __table_args__ = (UniqueConstraint("run_id", "step"),)

    id: Mapped[str] = _id()
    run_id: Mapped[str] = mapped_column(String(36), ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16), default="saved")  # saving | saved
    reward: Mapped[float | None] = mapped_column(Float)
    object_prefix: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()


class EvalImport(Base):
    """An upload of a local eval run (``osmosis eval upload``), resumable by its digest."""

    __tablename__ = "eval_imports"
    __table_args__ = (UniqueConstraint("workspace_id", "local_run_id", "manifest_digest"),)

    id: Mapped[str] = _id()
    workspace_id: Mapped[str] = _workspace_ref()
    run_id: Mapped[str] = mapped_column(String(36), ForeignKey("runs.id", ondelete="CASCADE"))
    creator_id: Mapped[str | None] = _user_ref()
    local_run_id: Mapped[str] = mapped_column(String(64))
    manifest_digest: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), default="uploading")  # | finalized
    files: Mapped[list[dict[str, object]]] = mapped_column(JSON)  # {path, size, sha256, state}
    payload: Mapped[dict[str, object]] = mapped_column(JSON)  # run, schema_versions, provenance
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = _created()


class RunLog(Base):
    """A log line of a run; the autoincrement id is the pagination cursor (never reused)."""

    __tablename__ = "run_logs"
    __table_args__ = (Index(None, "run_id", "id"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(36), ForeignKey("runs.id", ondelete="CASCADE"))
    timestamp: Mapped[datetime] = _created()
    level: Mapped[str] = mapped_column(String(16), default="info")
    step: Mapped[str] = mapped_column(String(32), default="")  # submit, setup, rollout, ...
    message: Mapped[str] = mapped_column(Text)
    details: Mapped[dict[str, object] | None] = mapped_column(JSON)
