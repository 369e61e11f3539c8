"""The errors of the local sandbox (``sandbox.py`` and the modules it is made of), each an
``OsmosisError`` that keeps the built-in base Harbor's own handling expects.

``SandboxError`` (a ``RuntimeError``)
 ├── ``SandboxTimeoutError``: a command ran past its timeout
 │    └── ``SandboxTransferTimeoutError`` (also a ``DeadlineError``)
 └── ``SandboxStartTimeoutError`` (also a ``DeadlineError``)
``UnsupportedDockerfileError`` (a ``ValueError``): a Dockerfile the sandbox cannot reproduce
``HarborFeatureUnsupportedError`` (a ``ValueError``): the installed Harbor lacks a feature
the task asks for
``AgentPrefixError`` (a ``RuntimeError``): an agent's host install prefix is missing its
program
"""

from __future__ import annotations

from osmosis_ai.errors import DeadlineError, OsmosisError

__all__ = [
    "AgentPrefixError",
    "HarborFeatureUnsupportedError",
    "SandboxError",
    "SandboxStartTimeoutError",
    "SandboxTimeoutError",
    "SandboxTransferTimeoutError",
    "UnsupportedDockerfileError",
]


class SandboxError(OsmosisError, RuntimeError):
    """The sandbox could not be set up or used."""


class SandboxTimeoutError(SandboxError):
    """A command ran past its timeout and was killed (its whole process group)."""


class SandboxStartTimeoutError(SandboxError, DeadlineError):
    """The sandbox's holder did not signal ready within ``OSMOSIS_SANDBOX_READY_TIMEOUT_S``
    (the sandbox is torn down)."""


class SandboxTransferTimeoutError(SandboxTimeoutError, DeadlineError):
    """A file transfer into or out of the sandbox ran past
    ``OSMOSIS_SANDBOX_TRANSFER_TIMEOUT_S``; its copy was killed."""


class UnsupportedDockerfileError(OsmosisError, ValueError):
    """The environment's Dockerfile uses something the sandbox cannot reproduce."""


class HarborFeatureUnsupportedError(OsmosisError, ValueError):
    """A task or trial asks for a Harbor feature the installed Harbor does not have; it is
    refused before anything runs. The message names the feature and the Harbor it needs."""


class AgentPrefixError(OsmosisError, RuntimeError):
    """A native agent run from a host install prefix (``agent_prefix``) finds no program
    there as the trial sees it; the trial's agent set-up fails, naming the prefix."""
