"""The Harbor agent that runs a user's ``AgentWorkflow`` inside the task environment.

Harbor builds it from ``AgentConfig(import_path=AGENT_IMPORT_PATH, kwargs=...)``. ``setup``
copies the user's code (a folder, or a pure-Python wheel put on ``PYTHONPATH`` as is) into
the environment; ``run`` uploads ``container_input.json`` to ``/logs/agent`` and runs the
in-environment runner, which writes ``container_result.json`` beside it. The backend reads
that file from the trial folder after the trial. Imports Harbor: load it only through
Harbor (the backend names it by import path).
"""

# Harbor needs Python 3.12+, so type checks on 3.11 run without it installed.
# pyright: reportMissingImports=false, reportUntypedBaseClass=false

from __future__ import annotations

import json
import logging
import shlex
import tempfile
from pathlib import Path
from typing import Any

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from osmosis_ai.consts import PACKAGE_VERSION
from osmosis_ai.rollout.container.files import AGENT_DIR, INPUT_NAME, RESULT_NAME

AGENT_NAME = "osmosis-workflow"
RUNNER_LOG = "runner.log"


class OsmosisWorkflowAgent(BaseAgent):
    """Runs ``python -m osmosis_ai.rollout.container.runner agent`` in the environment.

    Keyword arguments (set by the backend): ``osmosis_input`` (the container input, with
    ``prompt=None`` when the task's own instruction is the prompt), ``osmosis_uploads``
    (``[host path, environment path]`` pairs), ``osmosis_python`` (the interpreter in the
    environment) and ``osmosis_env`` (extra environment variables for the runner).
    """

    def __init__(
        self,
        logs_dir: Path,
        model_name: str | None = None,
        logger: logging.Logger | None = None,
        *,
        osmosis_input: dict[str, Any] | None = None,
        osmosis_uploads: list[list[str]] | None = None,
        osmosis_python: str = "python3",
        osmosis_env: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("mcp_servers", None)
        kwargs.pop("skills_dir", None)
        super().__init__(logs_dir=logs_dir, model_name=model_name, logger=logger, **kwargs)
        self._input = dict(osmosis_input or {})
        self._uploads = [
            (str(host), str(target), Path(host).is_dir()) for host, target in osmosis_uploads or []
        ]
        self._python = osmosis_python
        self._env = dict(osmosis_env or {})

    @staticmethod
    def name() -> str:
        return AGENT_NAME

    def version(self) -> str:
        return PACKAGE_VERSION

    async def setup(self, environment: BaseEnvironment) -> None:
        targets = sorted({str(Path(target).parent) for _host, target, _ in self._uploads})
        if targets:
            await environment.exec(f"mkdir -p {' '.join(shlex.quote(t) for t in targets)}")
        for host, target, is_dir in self._uploads:
            if is_dir:
                await environment.upload_dir(host, target)
            else:
                await environment.upload_file(host, target)

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        payload = dict(self._input)
        if payload.get("prompt") is None:
            payload["prompt"] = [{"role": "user", "content": instruction}]
        await environment.exec(f"mkdir -p {shlex.quote(str(AGENT_DIR))}")
        with tempfile.TemporaryDirectory(prefix="osmosis-input-") as scratch:
            staged = Path(scratch) / INPUT_NAME
            staged.write_text(json.dumps(payload), encoding="utf-8")
            await environment.upload_file(staged, str(AGENT_DIR / INPUT_NAME))
        command = f"{shlex.quote(self._python)} -m osmosis_ai.rollout.container.runner agent"
        result = await environment.exec(command, env=self._env or None)
        log = f"exit code: {result.return_code}\n--- stdout\n{result.stdout or ''}\n"
        log += f"--- stderr\n{result.stderr or ''}\n"
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        (self.logs_dir / RUNNER_LOG).write_text(log, encoding="utf-8")
        if not (self.logs_dir / RESULT_NAME).is_file():  # /logs/agent is not a host mount
            try:
                await environment.download_file(
                    str(AGENT_DIR / RESULT_NAME), self.logs_dir / RESULT_NAME
                )
            except Exception as exc:  # the backend reports the missing file
                self.logger.warning("no %s to download: %s", RESULT_NAME, exc)
        context.metadata = {**(context.metadata or {}), "runner_exit_code": result.return_code}
