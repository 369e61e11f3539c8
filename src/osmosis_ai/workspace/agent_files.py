"""Starter text of the agent guidance files ``osmosis doctor --fix`` writes into a workspace.

Short on purpose: they point coding agents at the layout, the workspace skills (bundled under
``osmosis_ai/templates/skills/``) and the commands that check work.
"""

from __future__ import annotations

ROOT_AGENTS_MD = """\
# Osmosis workspace

This repository trains and evaluates LLM agents with osmosis-ai.

## Layout

- `rollouts/<name>/` one rollout per directory: `main.py` (the entrypoint), `pyproject.toml`
  (its own dependencies), `README.md`. Rollout names match `^[a-z][a-z0-9-]*$`.
- `configs/eval/<name>.toml` and `configs/training/<name>.toml`: run configs
  (rules in `configs/AGENTS.md`).
- `data/`: local datasets (`.jsonl`, `.csv`, `.parquet`).
- `.osmosis/`: command outputs (eval runs under `.osmosis/evals/<run>/`); do not edit by hand.

## The entrypoint

`rollouts/<name>/main.py` runs as a script: it builds a backend (`LocalBackend(...)`) from an
`AgentWorkflow` and a `Grader`, passes it to `create_rollout_server(backend=...)` and serves
it with `run_rollout_server(app)` (port `$_OSMOSIS_ROLLOUT_PORT`, default 8000). The agent
sends every model call to its rollout-scoped `chat_completions_url`, never to a provider.

## Skills

Step-by-step guides for the common tasks live in `.agents/skills/<skill>/SKILL.md` (the same
files are in `.claude/skills/`): `plan-dataset`, `create-rollout`, `run-evaluation`,
`debug-rollout`, `prepare-training`. Read the one that matches the task before starting.
`osmosis doctor --fix` and `osmosis template apply` add missing skills;
`osmosis template list` shows working example rollouts.

## Checking work

- `osmosis doctor` checks this layout; `osmosis doctor --fix` creates what is missing.
- `osmosis dataset validate data/<file>` checks a dataset file.
- `osmosis eval run configs/eval/<name>.toml --rows 0-3` runs a few rows locally.
- `osmosis train run configs/training/<name>.toml` trains locally.
"""

CLAUDE_MD = """\
# Claude Code

Read and follow @AGENTS.md; config rules are in @configs/AGENTS.md.
"""

CONFIGS_AGENTS_MD = """\
# Run configs

`eval/*.toml` configure `osmosis eval run`; `training/*.toml` configure `osmosis train run`.
Unknown sections and keys are errors, and every problem in a file is reported at once.

## Sections

- `[experiment]` (required): `rollout` (a directory under `rollouts/`), `entrypoint`
  (a file inside it, usually `main.py`), `model_path`, `dataset`; optionally `branch` or
  `commit_sha` (7-40 hex), never both.
- `[evaluation]` (eval): `limit`, `n`, `batch_size`, `pass_threshold`,
  `agent_workflow_timeout_s`, `grader_timeout_s`.
- `[training]`, `[sampling]`, `[checkpoints]`, `[lora]`, `[warmup]` (training).
- `[env]`: string values for the rollout process; names match `^[A-Z_][A-Z0-9_]*$` and may
  not start with `_OSMOSIS_` (reserved).
- `[secrets]`: `required = ["OPENAI_API_KEY", ...]`, names of secrets supplied at run time
  (never written here). Required in eval configs (use `required = []` if none).
- `[advanced]`: free-form, passed through to the backend.

## Datasets

Prompt mode: columns `user_prompt` and `ground_truth` (or `label`), optional `system_prompt`.
Metadata mode: a `metadata` column holding a non-empty JSON object in every row.
At least 4 rows; in JSONL every row has the same keys.
"""
