"""``HarborBackend``: each rollout is one Harbor trial, run through a caller-owned
``TrialQueue``.

Two agent tracks. A native Harbor agent (``terminus-2``, ``mini-swe-agent``, ``claude-code``,
``opencode``, ``oracle``) is wired to the rollout's own model endpoint (``mini-swe-agent`` and
``claude-code`` optionally run from a host install prefix, see :mod:`.installed`). An
:class:`AgentWorkflow` (with an optional :class:`Grader`) runs inside the task environment
through the in-environment runner of :mod:`osmosis_ai.rollout.container.runner`: the user's
code is copied in (``code_dir``, by default the folder the workflow's module was imported
from, or a prebuilt pure-Python wheel, ``bundle``) and put on ``PYTHONPATH``. The grader
becomes the verifier when the task has no ``tests/test.sh``.

The reward is the verifier's ``rewards["reward"]``. After every trial the model API key is
scrubbed from every file of the trial folder, the trial's logs and artifacts are copied under
``<artifact root>/<rollout id>/``, and a successful trial's folder is deleted.

Harbor itself is imported only when a backend is constructed (Python 3.12+ with the
``harbor`` extra).
"""

# Harbor needs Python 3.12+, so type checks on 3.11 run without it installed.
# pyright: reportMissingImports=false

from __future__ import annotations

import asyncio
import atexit
import contextlib
import copy
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from osmosis_ai.procs import pid_alive
from osmosis_ai.rollout.agent_workflow import AgentWorkflow
from osmosis_ai.rollout.backend.base import ExecutionBackend, ResultCallback
from osmosis_ai.rollout.backend.harbor.options import (
    UNTRAINABLE_AGENTS,
    TaskMode,
    check_agent_prefix,
    check_native_agent,
    check_queue_depth,
    check_timeout,
    parse_task_mode,
    reject_legacy_keywords,
    require_harbor,
)
from osmosis_ai.rollout.backend.harbor.tasks import (
    TaskSelectionError,
    TaskSource,
    check_task_dir,
    copy_task,
    dataset_task,
    has_tests,
    install_grader_verifier,
    is_task_dir,
    network_modes,
    override_source,
    patch_dockerfile,
    write_instruction,
)
from osmosis_ai.rollout.backend.harbor.trials import keep_trial_outputs, remove_tree, scrub_secrets
from osmosis_ai.rollout.backend.local import default_artifact_root
from osmosis_ai.rollout.backend.registry import RolloutRegistry, TrackedRollout
from osmosis_ai.rollout.backend.status import HarborHealth, RolloutReport
from osmosis_ai.rollout.config import AgentWorkflowConfig, GraderConfig
from osmosis_ai.rollout.container.files import (
    GRADED_SAMPLE_NAME,
    GRADER_ERROR_NAME,
    RESULT_NAME,
    ContainerInput,
    ContainerResult,
    GraderSpec,
)
from osmosis_ai.rollout.context import (
    ENV_API_KEY,
    ENV_CHAT_COMPLETIONS_URL,
    get_rollout_context,
)
from osmosis_ai.rollout.execution import ExecutionOutcome, ExecutionRequest, ExecutionResult
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.imports import resolve_object, to_import_path
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.status import RolloutErrorCategory, RolloutStatus

logger = logging.getLogger(__name__)

AGENT_IMPORT_PATH = "osmosis_ai.rollout.backend.harbor.agent:OsmosisWorkflowAgent"
PREFIX_AGENT_CLASSES = {
    "mini-swe-agent": "osmosis_ai.rollout.backend.harbor.installed:PrefixMiniSweAgent",
    "claude-code": "osmosis_ai.rollout.backend.harbor.installed:PrefixClaudeCode",
}
"""Harbor's installed agents run from ``agent_prefix`` (keys: ``PREFIX_COMMANDS``)."""
SANDBOX_MODULE = "osmosis_ai.rollout.backend.harbor.sandbox"
CODE_DIR_IN_ENV = "/osmosis/code"
BUNDLE_DIR_IN_ENV = "/osmosis/bundle"
_CODE_IGNORED = (
    ".git",
    ".venv",
    ".venv-harbor",
    "__pycache__",
    "node_modules",
    ".osmosis",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
)
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_STAGE_NAME = re.compile(r"^(\d+)-[0-9a-f]+$")
# Staged code copies of this process's backends, removed at exit if shutdown did not, and
# their scratch roots, whose empty folders go at exit too.
_LIVE_STAGES: set[Path] = set()
_SCRATCH_ROOTS: set[Path] = set()
_DOCKER_STAGE = ".osmosis-sdk"

# Harbor exception type names -> (phase, category). Harbor records exceptions by name.
_EXCEPTIONS: dict[str, tuple[str, RolloutErrorCategory]] = {
    "AgentTimeoutError": ("agent", RolloutErrorCategory.TIMEOUT),
    "AgentSetupTimeoutError": ("agent_setup", RolloutErrorCategory.TIMEOUT),
    "EnvironmentStartTimeoutError": ("environment", RolloutErrorCategory.TIMEOUT),
    "NonZeroAgentExitCodeError": ("agent", RolloutErrorCategory.AGENT_ERROR),
    "ApiError": ("agent", RolloutErrorCategory.HTTP_ERROR),
    "ApiRateLimitError": ("agent", RolloutErrorCategory.HTTP_ERROR),
    "VerifierTimeoutError": ("verifier", RolloutErrorCategory.TIMEOUT),
    "RewardFileNotFoundError": ("verifier", RolloutErrorCategory.VALIDATION_ERROR),
    "RewardFileEmptyError": ("verifier", RolloutErrorCategory.VALIDATION_ERROR),
    "VerifierOutputParseError": ("verifier", RolloutErrorCategory.VALIDATION_ERROR),
    "AddTestsDirError": ("verifier", RolloutErrorCategory.AGENT_ERROR),
    "DownloadVerifierDirError": ("verifier", RolloutErrorCategory.AGENT_ERROR),
    "CancelledError": ("cancelled", RolloutErrorCategory.AGENT_ERROR),
}


@dataclass
class _Tracked(TrackedRollout):
    trial_name: str = ""
    started: bool = False


@dataclass
class _Plan:
    """One rollout's trial: its config, and the folders to clean up after it."""

    config: Any
    trial_name: str
    scratch: Path | None
    secrets: list[str] = field(default_factory=list)
    instruction: str | None = None  # the task's own instruction, when it is the prompt


class HarborBackend(ExecutionBackend):
    """Runs each rollout as a Harbor trial.

    Args:
        orchestrator: a ``harbor.trial.queue.TrialQueue`` you own (keep its retries at 0:
            the backend treats a trial's end as final). Its ``n_concurrent`` bounds trials
            running at once.
        tasks_dir: template mode: one task folder; dataset mode: a folder of task folders.
        agent: a native agent name (``terminus-2``, ``mini-swe-agent``, ``claude-code``,
            ``opencode``, ``oracle``), or an :class:`AgentWorkflow` subclass or its
            ``"module:Class"``.
        native_agent_kwargs: extra kwargs for a native agent.
        agent_prefix: for ``mini-swe-agent`` and ``claude-code``: a host folder where the
            agent is already installed (a virtual environment, an ``npm install --prefix``),
            used by the trial instead of Harbor's per-trial install (which downloads).
        task_mode: ``"template"`` (default) or ``"dataset"``.
        model_name: the model a native agent asks for (``metadata["harbor_model"]``
            overrides it per request).
        grader: a :class:`Grader` (or path), run as the verifier of tasks without
            ``tests/test.sh``; needs a workflow agent.
        workflow_config / grader_config: configs, as ``"module:attr"`` paths or as objects
            defined at module level of an importable module (the runner imports them).
        code_dir: the folder copied into the environment and put on ``PYTHONPATH``;
            defaults to the folder the workflow's top-level module was imported from.
        bundle: a prebuilt pure-Python wheel of your code, used instead of ``code_dir``.
        environment_config: a Harbor ``EnvironmentConfig``; by default Harbor's ``docker``
            where a Docker engine answers, else the bubblewrap sandbox.
        trials_dir: where Harbor writes trial folders (default: a folder per tasks dir
            under the system temp dir).
        cleanup_successful_trials: delete a successful trial's folder once its outputs are
            kept (failed ones stay, scrubbed).
        patch_dockerfile_with_sdk: for container environments, copy the SDK core into the
            task's image; default: on for a workflow agent outside the sandbox.
        agent_setup_timeout_sec: Harbor's agent setup timeout.
        max_queue_depth: rollouts in flight (queued + running) before the server answers
            429; ``None``: unbounded.
        artifact_root: where per-rollout folders go (default ``$_OSMOSIS_ROLLOUT_ARTIFACT_ROOT``
            or ``~/.osmosis``).
        status_retention_sec: how long finished rollouts stay visible to status queries.
    """

    reports_progress = True

    def __init__(
        self,
        *,
        orchestrator: Any = None,
        tasks_dir: str | os.PathLike[str] | None = None,
        agent: str | type[AgentWorkflow[Any]] | None = None,
        native_agent_kwargs: dict[str, Any] | None = None,
        agent_prefix: str | os.PathLike[str] | None = None,
        task_mode: TaskMode | str = TaskMode.TEMPLATE,
        model_name: str = "openai/osmosis-rollout",
        grader: type[Grader] | str | None = None,
        workflow_config: AgentWorkflowConfig | str | None = None,
        grader_config: GraderConfig | str | None = None,
        code_dir: str | os.PathLike[str] | None = None,
        bundle: str | os.PathLike[str] | None = None,
        environment_config: Any = None,
        trials_dir: str | os.PathLike[str] | None = None,
        cleanup_successful_trials: bool = True,
        patch_dockerfile_with_sdk: bool | None = None,
        agent_setup_timeout_sec: float | None = None,
        max_queue_depth: int | None = None,
        artifact_root: str | os.PathLike[str] | None = None,
        status_retention_sec: float = 900.0,
        **legacy: Any,
    ) -> None:
        reject_legacy_keywords(legacy)
        self.task_mode = parse_task_mode(task_mode)
        self.max_queue_depth = check_queue_depth(max_queue_depth)
        self.agent_setup_timeout_sec = check_timeout(
            "agent_setup_timeout_sec", agent_setup_timeout_sec
        )
        if orchestrator is None:
            raise ValueError(
                "orchestrator is required: pass a harbor.trial.queue.TrialQueue, e.g. "
                "TrialQueue(n_concurrent=4)"
            )
        if tasks_dir is None:
            raise ValueError("tasks_dir is required: the task folder (or folder of tasks)")
        if agent is None:
            raise ValueError(
                "agent is required: a native Harbor agent name (e.g. 'oracle', 'terminus-2') "
                "or an AgentWorkflow subclass / 'module:Class' path"
            )
        if code_dir is not None and bundle is not None:
            raise ValueError("pass code_dir or bundle, not both")
        if not model_name:
            raise ValueError(f"model_name must be a non-empty string, got {model_name!r}")
        self.tasks_dir = _check_tasks_dir(Path(tasks_dir), self.task_mode)
        self._set_agents(agent, grader, native_agent_kwargs)
        self.agent_prefix = check_agent_prefix(self.native_agent, agent_prefix)
        self.model_name = model_name
        self.workflow_config_path = _config_path(
            workflow_config, AgentWorkflowConfig, "workflow_config", self.workflow_cls
        )
        self.grader_config_path = _config_path(
            grader_config, GraderConfig, "grader_config", self.grader_cls
        )
        self._set_code(code_dir, bundle)
        self.patch_dockerfile_with_sdk = patch_dockerfile_with_sdk
        self.cleanup_successful_trials = cleanup_successful_trials
        self.artifact_root = Path(artifact_root) if artifact_root else default_artifact_root()
        self.status_retention_sec = status_retention_sec
        self.scratch_root = Path(tempfile.gettempdir()) / (
            "osmosis-harbor-" + sha256(str(self.tasks_dir).encode()).hexdigest()[:12]
        )
        self.trials_dir = (
            Path(trials_dir).expanduser().resolve() if trials_dir else self.scratch_root / "trials"
        )

        require_harbor()
        _check_orchestrator(orchestrator)
        self.orchestrator = orchestrator
        self.environment_config = environment_config
        self._code_stage: Path | None = None
        self._stage_lock = threading.Lock()  # trials are planned in threads, concurrently
        _SCRATCH_ROOTS.add(self.scratch_root)
        self._rollouts = RolloutRegistry[_Tracked](lambda: self.status_retention_sec)
        self._by_trial: dict[str, str] = {}
        self._plannings: set[_Planning] = set()  # plans still being made in threads
        self._register_hooks()

    def _set_agents(
        self, agent: Any, grader: Any, native_agent_kwargs: dict[str, Any] | None
    ) -> None:
        self.native_agent: str | None = None
        self.workflow_cls: type[AgentWorkflow[Any]] | None = None
        if isinstance(agent, str) and ":" not in agent:
            self.native_agent = check_native_agent(agent)
            if agent in UNTRAINABLE_AGENTS:
                warnings.warn(
                    f"agent={agent!r} runs the task's reference solution and calls no model: "
                    "use it to validate tasks and verifiers, not to train",
                    stacklevel=3,
                )
        else:
            self.workflow_cls = _resolve_class(agent, AgentWorkflow, "agent")
        self.grader_cls: type[Grader] | None = (
            None if grader is None else _resolve_class(grader, Grader, "grader")
        )
        if self.grader_cls is not None and self.workflow_cls is None:
            raise ValueError(
                "grader= grades a workflow's sample and needs agent= to be an AgentWorkflow; "
                "native Harbor agents are graded by the task's own tests/test.sh"
            )
        self.native_agent_kwargs = dict(native_agent_kwargs or {})
        if self.native_agent_kwargs and self.workflow_cls is not None:
            raise ValueError("native_agent_kwargs only applies to native Harbor agents")

    def _set_code(self, code_dir: Any, bundle: Any) -> None:
        self.bundle = None if bundle is None else Path(bundle).expanduser().resolve()
        if self.bundle is not None and not (self.bundle.is_file() and self.bundle.suffix == ".whl"):
            raise ValueError(f"bundle must be an existing .whl file, got {self.bundle}")
        self.code_dir: Path | None = None
        self.workflow_path: str | None = None
        self.grader_path: str | None = None
        if self.workflow_cls is None:
            if code_dir is not None or bundle is not None:
                raise ValueError("code_dir and bundle only apply to an AgentWorkflow agent")
            return
        self.workflow_path, default_dir = _container_import_path(self.workflow_cls)
        if self.grader_cls is not None:
            self.grader_path, _ = _container_import_path(self.grader_cls)
        if self.bundle is None:
            chosen = Path(code_dir).expanduser().resolve() if code_dir else default_dir
            if chosen is None or not chosen.is_dir():
                raise ValueError(
                    f"code_dir {chosen} is not a folder: pass code_dir= (the folder your "
                    "workflow's module is imported from) or bundle= (a wheel)"
                )
            self.code_dir = chosen

    # -- backend interface ---------------------------------------------------------------

    @property
    def capture_final_result(self) -> bool:
        return True

    @property
    def agent_label(self) -> str:
        if self.native_agent is not None:
            return self.native_agent
        return self.workflow_path or "workflow"

    def _counts(self) -> tuple[int, int]:
        queued = running = 0
        for tracked in self._rollouts:
            if tracked.status.is_terminal:
                continue
            if tracked.started:
                running += 1
            else:
                queued += 1
        return queued, running

    def has_capacity(self) -> bool:
        if self.max_queue_depth is None:
            return True
        queued, running = self._counts()
        return queued + running < self.max_queue_depth

    def health(self) -> dict[str, Any]:
        queued, running = self._counts()
        return HarborHealth(self.agent_label, running, queued, self.max_queue_depth).body()

    def rollout_status(self, rollout_id: str) -> dict[str, Any] | None:
        tracked = self._rollouts.get(rollout_id)
        if tracked is None:
            return None
        return RolloutReport.of(tracked, reward_on_success_only=True).body()

    def cancel_rollouts(
        self, ids: list[str] | None = None, prefix: str | None = None, all: bool = False
    ) -> dict[str, str]:
        return self._rollouts.cancel(
            ids,
            prefix,
            all,
            lambda tracked: "cancelled_running" if tracked.started else "cancelled_queued",
        )

    async def execute(
        self,
        request: ExecutionRequest,
        on_workflow_complete: ResultCallback | None = None,
        on_grader_complete: ResultCallback | None = None,
    ) -> ExecutionOutcome:
        tracked = self._rollouts.add(
            request.id, _Tracked(RolloutStatus.QUEUED, asyncio.current_task())
        )
        rctx = get_rollout_context()
        chat_url = (rctx.chat_completions_url if rctx else "") or os.environ.get(
            ENV_CHAT_COMPLETIONS_URL, ""
        )
        api_key = (rctx.api_key if rctx else None) or os.environ.get(ENV_API_KEY) or None
        try:
            outcome = await self._run(request, tracked, chat_url, api_key)
        except asyncio.CancelledError:
            self._finish(request.id, tracked, RolloutStatus.CANCELLED, None, "cancelled")
            raise
        except Exception as exc:
            logger.exception("rollout %s: harbor trial crashed", request.id)
            failed = ExecutionResult.failure(
                f"harbor trial crashed: {type(exc).__name__}: {exc}",
                RolloutErrorCategory.AGENT_ERROR,
            )
            outcome = ExecutionOutcome(failed, _ungraded(failed) if request.grade else None)
        await _notify(on_workflow_complete, outcome.workflow, "workflow")
        if request.grade and outcome.grader is not None:
            await _notify(on_grader_complete, outcome.grader, "grader")
        final = outcome.result
        self._finish(request.id, tracked, final.status, final.sample, final.err_message)
        return outcome

    async def shutdown(self, planning_timeout_sec: float = 60.0) -> None:
        """Cancel every rollout, wait (up to ``planning_timeout_sec``) for the task copies
        still being made in threads to be removed, then remove the scratch folders."""
        self.cancel_rollouts(all=True)
        pending = list(self._plannings)
        if pending:
            left = await asyncio.to_thread(_wait_plannings, pending, planning_timeout_sec)
            if left:
                logger.warning(
                    "HarborBackend shutdown: %d task copies were still being made after "
                    "%gs; their folders under %s are removed when the copies end",
                    left,
                    planning_timeout_sec,
                    self.scratch_root / "tasks",
                )
        self._drop_code_stage()
        _remove_empty_scratch(self.scratch_root)

    # -- prewarm -------------------------------------------------------------------------

    async def prewarm(self, task_ids: list[str] | None = None) -> dict[str, str]:
        """Build each task's environment and set up the agent once, before traffic
        (``install_only`` trials); a result per task: ``ok`` or the error."""
        from harbor.models.trial.config import TaskConfig, TrialConfig

        if self.task_mode is TaskMode.TEMPLATE:
            tasks = {self.tasks_dir.name: self.tasks_dir}
        else:
            names = task_ids or sorted(
                p.name for p in self.tasks_dir.iterdir() if p.is_dir() and is_task_dir(p)
            )
            tasks = {name: dataset_task(self.tasks_dir, name) for name in names}
        out: dict[str, str] = {}
        # The install-only trials' folders are of no use afterwards.
        trials_dir = self.scratch_root / "prewarm" / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            for name, path in tasks.items():
                config = TrialConfig(
                    task=TaskConfig(path=path),
                    trials_dir=trials_dir,
                    install_only=True,
                    agent=self._agent_config(None, "", "", None, None),
                    environment=self._environment_config(""),
                )
                result = await self.orchestrator.submit(config)
                info = result.exception_info
                out[name] = (
                    "ok" if info is None else f"{info.exception_type}: {info.exception_message}"
                )
        finally:
            await asyncio.to_thread(remove_tree, trials_dir)
        return out

    @contextlib.asynccontextmanager
    async def prewarm_lifespan(self, app: Any = None) -> AsyncGenerator[None]:
        """A lifespan for ``create_rollout_server(lifespan=...)`` that prewarms first."""
        del app
        await self.prewarm()
        yield

    # -- one trial -----------------------------------------------------------------------

    async def _run(
        self,
        request: ExecutionRequest,
        tracked: _Tracked,
        chat_url: str,
        api_key: str | None,
    ) -> ExecutionOutcome:
        for budget, phase in (
            (request.agent_timeout_sec, "workflow"),
            (request.grader_timeout_sec, "grader"),
        ):
            if budget is not None and budget <= 0:
                failed = ExecutionResult.failure(
                    f"{phase} exceeded its {budget:g}s deadline", RolloutErrorCategory.TIMEOUT
                )
                return ExecutionOutcome(failed, _ungraded(failed) if request.grade else None)
        trial_name = f"{_SAFE.sub('-', request.id)[:40]}__{uuid.uuid4().hex[:8]}"
        planning = _Planning(self._plannings)
        try:
            plan = await asyncio.to_thread(
                planning.run, self._plan, request, trial_name, chat_url, api_key
            )
        except asyncio.CancelledError:
            # The thread goes on copying the task: its copy is removed as soon as it is made.
            planning.cancel()
            raise
        except TaskSelectionError as exc:
            failed = ExecutionResult.failure(str(exc), RolloutErrorCategory.VALIDATION_ERROR)
            return ExecutionOutcome(failed, _ungraded(failed) if request.grade else None)
        tracked.trial_name = trial_name
        self._by_trial[trial_name] = request.id
        trial_dir = self.trials_dir / trial_name
        outcome: ExecutionOutcome | None = None
        try:
            started = time.monotonic()
            result = await self.orchestrator.submit(plan.config)
            outcome = await asyncio.to_thread(
                self._outcome, request, plan, result, trial_dir, time.monotonic() - started
            )
            return outcome
        finally:
            self._by_trial.pop(trial_name, None)
            success = outcome is not None and outcome.result.status == RolloutStatus.SUCCESS
            try:
                await asyncio.shield(
                    asyncio.to_thread(self._after_trial, request.id, plan, trial_dir, success)
                )
            except asyncio.CancelledError:
                self._after_trial(request.id, plan, trial_dir, success)
                raise

    def _plan(
        self, request: ExecutionRequest, trial_name: str, chat_url: str, api_key: str | None
    ) -> _Plan:
        """Pick and prepare the task, and build the trial's config (runs in a thread)."""
        from harbor.models.trial.config import TaskConfig, TrialConfig, VerifierConfig

        metadata = request.metadata or {}
        source = override_source(metadata)
        if source is None:
            if self.task_mode is TaskMode.TEMPLATE:
                source = TaskSource(local=self.tasks_dir)
            else:
                source = TaskSource(
                    local=dataset_task(self.tasks_dir, metadata.get("harbor_task_id"))
                )
        scratch: Path | None = None
        if source.local is not None:
            scratch = self.scratch_root / "tasks" / trial_name
            try:
                self._prepare_local(request, source, scratch)
            except BaseException:
                remove_tree(scratch)
                raise
            task = TaskConfig(path=scratch)
            env_mode, agent_mode = network_modes(scratch)
        else:
            if self.task_mode is TaskMode.TEMPLATE:
                logger.warning(
                    "rollout %s: task %s is downloaded by Harbor and keeps its own instruction",
                    request.id,
                    source.label,
                )
            task = TaskConfig(**source.remote)
            env_mode = agent_mode = "public"
        model = str(metadata.get("harbor_model") or self.model_name)
        # An allowlisted agent phase that differs from the environment's baseline gets the
        # model host itself; otherwise the baseline carries it (see _environment_config).
        agent = self._agent_config(
            request, chat_url, model, api_key, agent_mode if agent_mode != env_mode else None
        )
        verifier = VerifierConfig()
        if request.grader_timeout_sec is not None:
            verifier = VerifierConfig(override_timeout_sec=request.grader_timeout_sec)
        config = TrialConfig(
            task=task,
            trial_name=trial_name,
            trials_dir=self.trials_dir,
            agent=agent,
            environment=self._environment_config(chat_url, env_mode),
            verifier=verifier,
        )
        secrets = [api_key] if api_key else []
        instruction = None
        if self.task_mode is TaskMode.DATASET and scratch is not None:
            instruction = _read_text(scratch / "instruction.md")
        return _Plan(config, trial_name, scratch, secrets, instruction)

    def _prepare_local(self, request: ExecutionRequest, source: TaskSource, dest: Path) -> None:
        """Copy a local task to ``dest`` and make it this rollout's: its instruction in
        template mode, the grader as verifier when it has no tests, the SDK in its image."""
        assert source.local is not None
        metadata = request.metadata or {}
        dest.parent.mkdir(parents=True, exist_ok=True)
        copy_task(source.local, dest)
        if self.task_mode is TaskMode.TEMPLATE:
            if "harbor_task" in metadata or "harbor_task_id" in metadata:
                logger.warning(
                    "rollout %s: template mode replaces the instruction of the selected "
                    "task %s with the request's prompt",
                    request.id,
                    source.label,
                )
            write_instruction(dest, request.prompt)
        if not has_tests(dest):
            if self.grader_cls is None or self.grader_path is None:
                raise TaskSelectionError(
                    f"no reward source: task {source.label} has no tests/test.sh and no "
                    "grader= is configured"
                )
            spec = GraderSpec(
                grader=self.grader_path,
                grader_config=self.grader_config_path,
                label=request.label,
                metadata=copy.deepcopy(request.metadata),
                python_path=self._python_path(),
            )
            install_grader_verifier(dest, spec, self._runner_python())
        if self._patch_dockerfile():
            patch_dockerfile(dest, self._python_path(), _sdk_dir(), _DOCKER_STAGE)

    def _agent_config(
        self,
        request: ExecutionRequest | None,
        chat_url: str,
        model: str,
        api_key: str | None,
        agent_mode: str | None,
    ) -> Any:
        from harbor.models.trial.config import AgentConfig

        common: dict[str, Any] = {}
        if request is not None and request.agent_timeout_sec is not None:
            common["override_timeout_sec"] = request.agent_timeout_sec
        if self.agent_setup_timeout_sec is not None:
            common["override_setup_timeout_sec"] = self.agent_setup_timeout_sec
        host = urlsplit(chat_url).hostname if chat_url else None
        if agent_mode == "allowlist" and host:
            # The model endpoint is the one host an allowlisted agent must reach; a
            # no-network phase is never loosened (the sandbox forwards the endpoint).
            common["extra_allowed_hosts"] = [host]
        if self.native_agent is not None:
            return self._native_agent_config(chat_url, model, api_key, common)
        uploads: list[list[str]] = []
        if self.bundle is not None:
            uploads.append([str(self.bundle), f"{BUNDLE_DIR_IN_ENV}/{self.bundle.name}"])
        elif self.code_dir is not None:
            uploads.append([str(self._staged_code()), CODE_DIR_IN_ENV])
        payload: dict[str, Any] | None = None
        if request is not None:
            payload = ContainerInput(
                rollout_id=request.id,
                prompt=copy.deepcopy(request.prompt),
                metadata=copy.deepcopy(request.metadata),
                chat_completions_url=chat_url,
                api_key=api_key,
                workflow=self.workflow_path or "",
                workflow_config=self.workflow_config_path,
                python_path=self._python_path(),
            ).model_dump()
            if self.task_mode is TaskMode.DATASET:
                payload["prompt"] = None  # the task's own instruction is the prompt
        return AgentConfig(
            import_path=AGENT_IMPORT_PATH,
            model_name=model,
            kwargs={
                "osmosis_input": payload,
                "osmosis_uploads": uploads,
                "osmosis_python": self._runner_python(),
                "osmosis_env": {"PYTHONPATH": ":".join(self._python_path())},
            },
            **common,
        )

    def _native_agent_config(
        self, chat_url: str, model: str, api_key: str | None, common: dict[str, Any]
    ) -> Any:
        from harbor.models.trial.config import AgentConfig

        if self.native_agent == "oracle":
            return AgentConfig(name="oracle", **common)
        if self.native_agent == "terminus-2":
            kwargs: dict[str, Any] = {
                "api_base": chat_url or None,
                # Summarising rewrites history; the token trajectory must stay append-only.
                "enable_summarize": False,
                **self.native_agent_kwargs,
            }
            if api_key:
                kwargs["llm_kwargs"] = {**kwargs.get("llm_kwargs", {}), "api_key": api_key}
            return AgentConfig(name="terminus-2", model_name=model, kwargs=kwargs, **common)
        kwargs = dict(self.native_agent_kwargs)
        if self.native_agent == "claude-code":
            # Claude Code speaks the Messages API: it appends /v1/messages to the base URL.
            env = {"ANTHROPIC_BASE_URL": chat_url} if chat_url else {}
            if api_key:
                env["ANTHROPIC_API_KEY"] = api_key
            model = "anthropic/" + model.rpartition("/")[2]
        else:
            env = {"MSWEA_COST_TRACKING": "ignore_errors"}
            if chat_url:
                env |= {"OPENAI_API_BASE": chat_url, "OPENAI_BASE_URL": chat_url}
            if api_key:
                env["OPENAI_API_KEY"] = api_key
        name = str(self.native_agent)
        placement: dict[str, Any] = {"name": name}
        if self.agent_prefix is not None:
            placement = {"import_path": PREFIX_AGENT_CLASSES[name]}
            kwargs["host_prefix"] = self.agent_prefix
        return AgentConfig(**placement, model_name=model, env=env, kwargs=kwargs, **common)

    def _environment_config(self, chat_url: str, env_mode: str = "") -> Any:
        config = self._base_environment().model_copy(deep=True)
        host = urlsplit(chat_url).hostname if chat_url else None
        if env_mode == "allowlist" and host:
            # The model endpoint is the one host an allowlisted task must reach; a
            # no-network task is never loosened (the sandbox forwards the endpoint instead).
            config.extra_allowed_hosts = [*config.extra_allowed_hosts, host]
        if config.import_path and config.import_path.startswith(SANDBOX_MODULE):
            kwargs = dict(config.kwargs)
            if chat_url:
                kwargs = _with_forwarded_endpoint(kwargs, chat_url)
            if self.agent_prefix is not None:
                # seen by the trial wherever it lies (the trial has a /tmp of its own)
                kwargs["shared_paths"] = [*kwargs.get("shared_paths", ()), self.agent_prefix]
            config.kwargs = kwargs
        return config

    # -- results ---------------------------------------------------------------------------

    def _outcome(
        self,
        request: ExecutionRequest,
        plan: _Plan,
        result: Any,
        trial_dir: Path,
        elapsed: float,
    ) -> ExecutionOutcome:
        info = result.exception_info
        exc_type = info.exception_type if info is not None else None
        phase, category = _EXCEPTIONS.get(exc_type or "", ("", RolloutErrorCategory.AGENT_ERROR))
        if info is not None and not phase:
            phase = "verifier" if result.verifier is not None else "environment"
        diagnostics: dict[str, Any] = {
            "backend": "harbor",
            "trial_name": plan.trial_name,
            "phase": phase or "done",
            "harbor_exception_type": exc_type,
            "category": category.value if info is not None else None,
            "timings_sec": _timings(result, elapsed),
        }
        workflow = self._workflow_result(
            request, plan=plan, trial_dir=trial_dir, info=info, phase=phase, category=category
        )
        workflow.extra_fields = diagnostics
        if not request.grade:
            return ExecutionOutcome(workflow)
        if workflow.status != RolloutStatus.SUCCESS:
            return ExecutionOutcome(workflow, _ungraded(workflow))
        grader = self._grader_result(
            workflow.sample,
            result=result,
            trial_dir=trial_dir,
            info=info,
            phase=phase,
            category=category,
        )
        grader.extra_fields = diagnostics
        return ExecutionOutcome(workflow, grader)

    def _workflow_result(
        self,
        request: ExecutionRequest,
        *,
        plan: _Plan,
        trial_dir: Path,
        info: Any,
        phase: str,
        category: RolloutErrorCategory,
    ) -> ExecutionResult:
        if info is not None and phase in ("agent", "agent_setup", "environment", "cancelled"):
            return ExecutionResult.failure(
                f"harbor {phase} failed: {info.exception_type}: {info.exception_message}".strip(),
                category,
            )
        if self.workflow_cls is None:
            messages = request.prompt
            if plan.instruction is not None:
                messages = [{"role": "user", "content": plan.instruction}]
            return ExecutionResult(
                RolloutStatus.SUCCESS,
                RolloutSample(messages=messages, label=request.label),
            )
        result_path = trial_dir / "agent" / RESULT_NAME
        if not result_path.is_file():
            log = _read_text(trial_dir / "agent" / "runner.log") or ""
            return ExecutionResult.failure(
                f"the workflow runner wrote no {RESULT_NAME}"
                + (f"; runner log: {log[-800:]}" if log else ""),
                RolloutErrorCategory.AGENT_ERROR,
            )
        try:
            container = ContainerResult.model_validate_json(result_path.read_bytes())
        except Exception as exc:
            return ExecutionResult.failure(
                f"{RESULT_NAME} is not valid: {exc}", RolloutErrorCategory.VALIDATION_ERROR
            )
        if container.status != RolloutStatus.SUCCESS.value:
            return ExecutionResult.failure(
                container.err_message or "the workflow failed",
                _category(container.err_category),
            )
        sample = None
        if container.sample is not None:
            sample = RolloutSample.model_validate(container.sample)
            sample.label = request.label
        return ExecutionResult(RolloutStatus.SUCCESS, sample)

    def _grader_result(
        self,
        sample: RolloutSample | None,
        *,
        result: Any,
        trial_dir: Path,
        info: Any,
        phase: str,
        category: RolloutErrorCategory,
    ) -> ExecutionResult:
        verifier_dir = trial_dir / "verifier"
        grader_error = _read_text(verifier_dir / GRADER_ERROR_NAME)
        if info is not None and phase == "verifier":
            detail = grader_error.strip() if grader_error else info.exception_message
            return ExecutionResult.failure(
                f"harbor verifier failed: {info.exception_type}: {detail}", category, sample
            )
        rewards = result.verifier_result.rewards if result.verifier_result is not None else None
        if not rewards:
            return ExecutionResult.failure(
                "the verifier wrote no reward (neither reward.txt nor reward.json)"
                + (f": {grader_error.strip()}" if grader_error else ""),
                RolloutErrorCategory.VALIDATION_ERROR,
                sample,
            )
        if "reward" not in rewards:
            return ExecutionResult.failure(
                f"the verifier's rewards have no 'reward' key (got {sorted(rewards)})",
                RolloutErrorCategory.VALIDATION_ERROR,
                sample,
            )
        graded = sample.model_copy(deep=True) if sample is not None else RolloutSample()
        graded_path = verifier_dir / GRADED_SAMPLE_NAME
        if graded_path.is_file():
            with contextlib.suppress(Exception):
                graded = RolloutSample.model_validate_json(graded_path.read_bytes())
                graded.label = sample.label if sample is not None else None
        try:
            graded.reward = float(rewards["reward"])
        except (TypeError, ValueError) as exc:
            return ExecutionResult.failure(
                f"the verifier's reward {rewards['reward']!r} is not a finite number: {exc}",
                RolloutErrorCategory.VALIDATION_ERROR,
                sample,
            )
        return ExecutionResult(RolloutStatus.SUCCESS, graded)

    def _after_trial(self, rollout_id: str, plan: _Plan, trial_dir: Path, success: bool) -> None:
        """Scrub, keep the outputs, and clean up (runs in a thread; never raises)."""
        try:
            scrub_secrets(trial_dir, plan.secrets)
            keep_trial_outputs(trial_dir, self.artifact_root / rollout_id)
            scrub_secrets(self.artifact_root / rollout_id, plan.secrets)
            if success and self.cleanup_successful_trials:
                remove_tree(trial_dir)
        except Exception:
            logger.exception("rollout %s: cleaning up trial %s failed", rollout_id, trial_dir)
        finally:
            if plan.scratch is not None:
                remove_tree(plan.scratch)

    # -- helpers ---------------------------------------------------------------------------

    def _base_environment(self) -> Any:
        """The user's ``environment_config``, else the default (chosen once: asking
        whether a Docker engine answers takes a subprocess)."""
        if self.environment_config is None:
            self.environment_config = _default_environment()
        return self.environment_config

    def _in_sandbox(self) -> bool:
        config = self._base_environment()
        return bool(config.import_path and config.import_path.startswith(SANDBOX_MODULE))

    def _runner_python(self) -> str:
        override = os.environ.get("OSMOSIS_HARBOR_PYTHON")
        if override:
            return override
        # The bubblewrap sandbox shows the host's files, so the host interpreter (with the
        # SDK and the workflow's framework installed) runs there as is.
        return sys.executable if self._in_sandbox() else "python3"

    def _patch_dockerfile(self) -> bool:
        if self.workflow_cls is None:
            return False
        if self.patch_dockerfile_with_sdk is not None:
            return self.patch_dockerfile_with_sdk
        return not self._in_sandbox()

    def _python_path(self) -> list[str]:
        if self.bundle is not None:
            return [f"{BUNDLE_DIR_IN_ENV}/{self.bundle.name}"]
        if self.code_dir is not None:
            return [CODE_DIR_IN_ENV]
        return []

    def _staged_code(self) -> Path:
        """A copy of ``code_dir`` without VCS folders, virtualenvs and caches, made once.

        It lives under ``<scratch root>/code/<pid>-<id>`` until :meth:`shutdown` or the
        process's exit; copies left by processes that are gone (killed with -9) are removed
        the next time a copy is made.
        """
        with self._stage_lock:
            if self._code_stage is not None and self._code_stage.is_dir():
                return self._code_stage
            assert self.code_dir is not None
            stages = self.scratch_root / "code"
            _remove_orphan_stages(stages)
            stage = stages / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                shutil.copytree(
                    self.code_dir,
                    stage,
                    symlinks=False,
                    ignore=shutil.ignore_patterns(*_CODE_IGNORED),
                    ignore_dangling_symlinks=True,
                )
            except BaseException:
                remove_tree(stage)
                raise
            self._drop_code_stage_locked()
            self._code_stage = stage
            _LIVE_STAGES.add(stage)
            return stage

    def _drop_code_stage(self) -> None:
        with self._stage_lock:
            self._drop_code_stage_locked()

    def _drop_code_stage_locked(self) -> None:
        stage, self._code_stage = self._code_stage, None
        if stage is not None:
            _LIVE_STAGES.discard(stage)
            _remove_stage(stage)

    def _register_hooks(self) -> None:
        from harbor.trial.hooks import TrialEvent

        self.orchestrator.add_hook(TrialEvent.START, self._hook(RolloutStatus.RUNNING))
        self.orchestrator.add_hook(TrialEvent.VERIFICATION_START, self._hook(RolloutStatus.GRADING))

    def _hook(self, status: RolloutStatus) -> Callable[[Any], Any]:
        async def hook(event: Any) -> None:
            # Harbor does not guard its hooks: this one never raises.
            try:
                rollout_id = self._by_trial.get(str(event.trial_name))
                tracked = self._rollouts.get(rollout_id) if rollout_id else None
                if tracked is None or tracked.status.is_terminal:
                    return
                tracked.started = True
                tracked.status = status
                rctx_status = get_rollout_context()
                if rctx_status is not None and rctx_status.rollout_id == rollout_id:
                    await rctx_status.set_status(status)
            except Exception:
                logger.exception("harbor hook for %s failed", status.value)

        return hook

    def _finish(
        self,
        rollout_id: str,
        tracked: _Tracked,
        status: RolloutStatus,
        sample: RolloutSample | None,
        err_message: str | None,
    ) -> None:
        self._rollouts.finish(rollout_id, tracked, status, sample, err_message)


HarborBackendV2 = HarborBackend
"""The 0.2 name of :class:`HarborBackend`, kept so old imports still resolve."""


# -- module helpers ----------------------------------------------------------------------------


def _check_tasks_dir(path: Path, mode: TaskMode) -> Path:
    tasks_dir = path.expanduser().resolve()
    if not tasks_dir.is_dir():
        raise ValueError(f"tasks_dir {tasks_dir} is not a folder")
    if mode is TaskMode.TEMPLATE:
        if not is_task_dir(tasks_dir):
            raise ValueError(
                f"template mode needs tasks_dir to be one task folder (with task.toml); "
                f"{tasks_dir} has none. For a folder of tasks use task_mode='dataset'"
            )
        try:
            check_task_dir(tasks_dir)
        except TaskSelectionError as exc:
            raise ValueError(str(exc)) from None
    return tasks_dir


def _check_orchestrator(orchestrator: Any) -> None:
    from harbor.trial.queue import TrialQueue

    if not isinstance(orchestrator, TrialQueue):
        raise TypeError(
            f"orchestrator must be a harbor.trial.queue.TrialQueue, got {orchestrator!r}"
        )
    retries = getattr(getattr(orchestrator, "_retry_config", None), "max_retries", 0)
    if retries:
        warnings.warn(
            f"the TrialQueue retries failed trials ({retries} retries): HarborBackend "
            "treats a trial's end as final, so keep RetryConfig(max_retries=0)",
            stacklevel=3,
        )


class _Planning:
    """One plan made in a thread; a rollout cancelled meanwhile gets its task copy removed
    whether the thread is done or not (the thread is not stopped by the cancel)."""

    def __init__(self, registry: set[_Planning]) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._plan: _Plan | None = None
        self.done = threading.Event()  # set once the thread is over (its copy kept or gone)
        self._registry = registry
        registry.add(self)

    def run(self, make: Callable[..., _Plan], *args: Any) -> _Plan:
        try:
            plan = make(*args)
            with self._lock:
                if not self._cancelled:
                    self._plan = plan
                    return plan
            _discard(plan)
            return plan
        finally:
            self._registry.discard(self)
            self.done.set()

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            plan, self._plan = self._plan, None
        if plan is not None:
            _discard(plan)


def _wait_plannings(plannings: list[_Planning], timeout: float) -> int:
    """Wait for planning threads to end, all within ``timeout`` seconds; how many did not."""
    deadline = time.monotonic() + timeout
    for planning in plannings:
        planning.done.wait(max(0.0, deadline - time.monotonic()))
    return sum(not planning.done.is_set() for planning in plannings)


def _discard(plan: _Plan) -> None:
    if plan.scratch is not None:
        remove_tree(plan.scratch)


@atexit.register
def _remove_live_stages() -> None:
    for stage in list(_LIVE_STAGES):
        _remove_stage(stage)
    _LIVE_STAGES.clear()
    for root in list(_SCRATCH_ROOTS):
        _remove_empty_scratch(root)


def _remove_stage(stage: Path) -> None:
    """Remove a staged code copy, then the scratch folders left empty."""
    remove_tree(stage)
    _remove_empty_scratch(stage.parent.parent)


def _remove_empty_scratch(root: Path) -> None:
    """Remove the scratch root's empty folders, and the root once empty; kept trials
    (failed ones, in the default trials folder) keep theirs."""
    for folder in (*(root / name for name in ("code", "tasks", "prewarm", "trials")), root):
        with contextlib.suppress(OSError):
            folder.rmdir()


def _remove_orphan_stages(stages: Path) -> None:
    """Remove staged code copies whose process is gone (``<pid>-<id>`` folders)."""
    try:
        entries = list(stages.iterdir())
    except OSError:
        return
    for entry in entries:
        match = _STAGE_NAME.match(entry.name)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        if not pid_alive(int(match.group(1))):
            remove_tree(entry)


def _default_environment() -> Any:
    """Harbor's ``docker`` where a Docker engine answers, else the bubblewrap sandbox."""
    from osmosis_ai.rollout.backend.harbor.sandbox import default_environment_config

    return default_environment_config()


def _with_forwarded_endpoint(kwargs: dict[str, Any], chat_url: str) -> dict[str, Any]:
    forwarded = list(kwargs.get("forward_endpoints") or [])
    if chat_url not in forwarded:
        forwarded.append(chat_url)
    kwargs["forward_endpoints"] = forwarded
    return kwargs


def _sdk_dir() -> Path:
    return Path(__file__).resolve().parents[3]  # osmosis_ai/rollout/backend/harbor/backend.py


def _resolve_class(value: Any, base: type[Any], what: str) -> Any:
    obj = resolve_object(value) if isinstance(value, str) else value
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise TypeError(
            f"{what} must be a {base.__name__} subclass or its 'module:Class' path, got {obj!r}"
        )
    return obj


def _module_file_name(module_name: str) -> tuple[str, Path | None]:
    """The importable name of ``module_name`` (a script run as ``__main__`` is imported by
    its file's stem) and the folder its top-level package is imported from."""
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if not file:
        return module_name, None
    path = Path(file).resolve()
    if module_name == "__main__":
        return path.stem, path.parent
    depth = module_name.count(".") + (1 if path.name == "__init__.py" else 0)
    root = path.parent
    for _ in range(depth):
        root = root.parent
    return module_name, root


def _container_import_path(obj: Any) -> tuple[str, Path | None]:
    """``"module:qualname"`` under which the runner imports ``obj``, and its code root."""
    path = to_import_path(obj)
    module_name, _, qualname = path.partition(":")
    importable, root = _module_file_name(module_name)
    return f"{importable}:{qualname}", root


def _config_path(value: Any, base: type[Any], what: str, owner: type[Any] | None) -> str | None:
    """A config as the ``"module:attr"`` path the runner imports it by."""
    if value is None:
        return None
    if isinstance(value, str):
        obj = resolve_object(value)
        if not isinstance(obj, base):
            raise TypeError(f"{what} {value!r} is not a {base.__name__} instance")
        module_name, _, attr = value.partition(":")
        importable, _ = _module_file_name(module_name)
        return f"{importable}:{attr}"
    if not isinstance(value, base):
        raise TypeError(f"{what} must be a {base.__name__} instance or its 'module:attr' path")
    modules = [getattr(owner, "__module__", None), "__main__"]
    for module_name in dict.fromkeys(m for m in modules if m):
        module = sys.modules.get(module_name)
        for attr, candidate in vars(module).items() if module else ():
            if candidate is value and not attr.startswith("__"):
                importable, _ = _module_file_name(module_name)
                return f"{importable}:{attr}"
    raise ValueError(
        f"{what} must be importable inside the task environment: define it at module level "
        "next to your workflow (e.g. WORKFLOW_CONFIG = ...) or pass its 'module:attr' path"
    )


def _category(value: str | None) -> RolloutErrorCategory:
    try:
        return RolloutErrorCategory(value or "agent_error")
    except ValueError:
        return RolloutErrorCategory.AGENT_ERROR


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _timings(result: Any, elapsed: float) -> dict[str, float]:
    out = {"total": round(elapsed, 3)}
    for name in ("environment_setup", "agent_setup", "agent_execution", "verifier"):
        timing = getattr(result, name, None)
        if timing is not None and timing.started_at and timing.finished_at:
            out[name] = round((timing.finished_at - timing.started_at).total_seconds(), 3)
    return out


def _ungraded(workflow: ExecutionResult) -> ExecutionResult:
    return ExecutionResult.failure(workflow.err_message, workflow.err_category)


async def _notify(callback: ResultCallback | None, result: ExecutionResult, phase: str) -> None:
    if callback is None:
        return
    try:
        await callback(result)
    except asyncio.CancelledError:
        raise
    except Exception:
        logger.exception("on_%s_complete callback failed", phase)
