"""The self-hosted Osmosis platform: its server, and the client the CLI talks to it with.

Layout (server parts need the ``platform`` extra and are imported only when used)::

    settings.py      PlatformSettings: data dir, database URL, public URL (tokens are scoped
                     to it), load_settings(); standard library only
    errors.py        PlatformError tree; each error knows its HTTP status and envelope
                     {error, message, code?, field?, details?}; light to import
    auth.py          API tokens: mint (raw shown once, SHA-256 stored), authenticate with
                     distinct 401 codes, revoke; Principal = the caller
    store/orm.py     the one ORM module: every table (SQLAlchemy 2 typed declarative)
    store/database.py  make_engine (SQLite WAL + pragmas, or PostgreSQL), Database with
                     transaction() (writes; SQLite BEGIN IMMEDIATE) and read() (read-only,
                     never waits for the write lock), open_database(settings) which migrates
    store/migrate.py Alembic run programmatically under a lock; refuses a newer schema
    store/migrations/versions/  the revisions (the schema changes only here)
    services/        plain functions over a Session, one module per resource (accounts.py:
                     users, workspaces, memberships, Git-identity lookup; device.py: device
                     login; rollouts.py: Git sync and the per-branch catalog, which takes the
                     Database because git must not run inside a transaction, and reuses a
                     fetch younger than settings.git_refresh_s for listings; models.py;
                     runs.py + run_config.py: eval/training run submits, list, stop, logs;
                     eval_results.py: eval metrics from stored samples, the samples
                     manifest and signed downloads, retry, local-run imports);
                     they raise errors.py
    gitsync.py       bare mirrors under the data dir, branches, rollouts/<name>/main.py
    admin.py         what `osmosis platform user|workspace|token|model` do, one transaction
    server.py        serve(settings): uvicorn, after the database is opened and migrated
    api/app.py       create_platform_app(settings); ROUTERS lists the router modules
    api/deps.py      Platform (settings, database, clock), PrincipalDep, WorkspaceDep
                     (from X-Osmosis-Git, or X-Osmosis-Workspace: NAME; a workspace the
                     caller is not in answers 404)
    api/access.py    AccessCache: token and workspace lookups kept for at most a second,
                     dropped at once by a commit in this process that changes access
    api/errors.py    every error as the envelope; 422 becomes 400 VALIDATION with issues
    api/version.py   X-Osmosis-Version-* headers, 426 below MIN_SUPPORTED_CLI_VERSION
    api/wire.py      shared pydantic wire models; a resource's own live in its router
    api/<resource>.py  one router per resource (tokens.py, device.py, workspaces.py,
                     rollouts.py, runs.py for /api/cli/eval-runs and training-runs, ...)
    api/inference.py the OpenAI-compatible /v1 endpoint of deployed LoRA models (platform
                     token or workspace serving key), routed by model name to
    serving.py       the deployment manager: one model server per deployed model
                     (controller/policy, the local policy server; or vLLM on a GPU)
    web/device.py    the /device page that approves a device login (CSRF, escaped HTML)
    web/dashboard.py the dashboard at / (sign-in with email + token; runs, training and eval
                     run pages, datasets, models, secrets, members); see web/__init__.py
    crypto.py        data-dir keys, secret encryption; objects.py  file store, signed URLs
    client/          what the CLI uses: the /api/cli client, credentials, transfers, the
                     submit preflight, the CLI's upload/download/login/submit sequences
                     (imports no server code; see client/__init__.py)
"""

from __future__ import annotations
