"""Harbor's own installed agents, run from a host install prefix instead of installed in
the trial.

Harbor's ``mini-swe-agent`` and ``claude-code`` classes install their program at every
trial (``uv tool install`` from PyPI, Anthropic's bootstrap script), which a ``no-network``
task forbids. The classes here are those same classes with ``install`` replaced: the
program comes from a prefix installed once on the host (``scripts/setup_harbor.sh``: a
virtual environment with ``pip install mini-swe-agent``, ``npm install --prefix <dir>
@anthropic-ai/claude-code``), which the local sandbox shows read-only-by-copy-on-write (it
is a view of the host's root filesystem). ``install`` checks the program is there and links
it into ``$HOME/.local/bin``, where Harbor's ``run`` looks for it; everything else (the
command line, the model and endpoint settings, the trajectory) is Harbor's. Imports Harbor:
load it only through Harbor (the backend names the classes by import path).
"""

# Harbor needs Python 3.12+, so type checks on 3.11 run without it installed.
# pyright: reportMissingImports=false, reportUntypedBaseClass=false

from __future__ import annotations

import shlex
from typing import Any, ClassVar

from harbor.agents.installed.claude_code import ClaudeCode
from harbor.agents.installed.mini_swe_agent import MiniSweAgent
from harbor.environments.base import BaseEnvironment

from osmosis_ai.rollout.backend.harbor.errors import AgentPrefixError
from osmosis_ai.rollout.backend.harbor.options import PREFIX_COMMANDS

PREFIX_BIN_DIRS = ("bin", "node_modules/.bin")
"""Where a prefix keeps its programs: a virtual environment or ``npm install -g --prefix``
(``bin``), a plain ``npm install --prefix`` (``node_modules/.bin``)."""


def link_command(prefix: str, command: str) -> str:
    """The shell command that finds ``command`` under ``prefix``, links it into
    ``$HOME/.local/bin`` and prints where it came from (exit 3 when it is not there)."""
    candidates = " ".join(shlex.quote(f"{prefix}/{d}/{command}") for d in PREFIX_BIN_DIRS)
    return (
        f'for found in {candidates}; do [ -x "$found" ] && break; found=; done; '
        '[ -n "$found" ] || exit 3; '
        'mkdir -p "$HOME/.local/bin" && '
        f'ln -sf "$found" "$HOME/.local/bin/{command}" && echo "$found"'
    )


class _FromHostPrefix:
    """Mixed in before a Harbor installed agent: ``host_prefix`` replaces its install."""

    agent_name: ClassVar[str]
    _host_prefix: str

    def _take_prefix(self, kwargs: dict[str, Any]) -> None:
        prefix = kwargs.pop("host_prefix", None)
        if not prefix:
            raise AgentPrefixError(
                f"{self.agent_name}: host_prefix (the install prefix) is required"
            )
        self._host_prefix = str(prefix)

    async def install(self, environment: BaseEnvironment) -> None:
        command = PREFIX_COMMANDS[self.agent_name]
        result = await environment.exec(link_command(self._host_prefix, command))
        if result.return_code != 0:
            raise AgentPrefixError(
                f"{self.agent_name}: no {command} under {self._host_prefix} "
                f"({' or '.join(PREFIX_BIN_DIRS)}) as the trial sees it (exit "
                f"{result.return_code}: {(result.stderr or result.stdout or '').strip()[-300:]}); "
                "run scripts/setup_harbor.sh, or point agent_prefix at the install"
            )


class PrefixMiniSweAgent(_FromHostPrefix, MiniSweAgent):
    """Harbor's ``mini-swe-agent``, run from a host virtual environment."""

    agent_name = "mini-swe-agent"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._take_prefix(kwargs)
        super().__init__(*args, **kwargs)


class PrefixClaudeCode(_FromHostPrefix, ClaudeCode):
    """Harbor's ``claude-code``, run from a host ``npm install --prefix``.

    Two of Claude Code's own options, which Harbor's class does not pass, may be given as
    kwargs: ``tools`` (``--tools``: the built-in tools offered to the model, e.g.
    ``"Bash,Write"``) and ``system_prompt`` (``--system-prompt``: replaces the default
    system prompt). Unset, the command line is Harbor's.
    """

    agent_name = "claude-code"

    def __init__(
        self,
        *args: Any,
        tools: str | None = None,
        system_prompt: str | None = None,
        **kwargs: Any,
    ) -> None:
        self._take_prefix(kwargs)
        self._own_flags = [
            f"{flag} {shlex.quote(value)}"
            for flag, value in (("--tools", tools), ("--system-prompt", system_prompt))
            if value is not None
        ]
        super().__init__(*args, **kwargs)

    def build_cli_flags(self) -> str:
        return " ".join(filter(None, [super().build_cli_flags(), *self._own_flags]))
